"""The coordinator ("appliance mode"): turns params + num_csx into a plan, starts every role through a backend
(local processes or Kubernetes pods), drives the steps, and reports progress. Built in issues 3-5."""
