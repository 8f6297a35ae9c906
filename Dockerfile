# One image for every weightstream role; the command picks it:
#   weightstream memoryx|swarmx|worker|activation|serve|run ...
# Build:  podman build --network host -t weightstream:dev .   (or: docker build -t weightstream:dev .)
#
# Stage 1 builds a virtual environment with weightstream and its dependencies (wheels only, so no
# compiler is needed); stage 2 copies just that environment onto a clean base: no pip cache, no build
# tools, no sources, a non-root user.
FROM python:3.11-slim AS build
# On every image and cache layer this file makes, so that they can be found and pruned (the build stage and
# the cache are left as untagged images: ~2 GB a build with MKL in it). `podman image prune -f --filter
# label=io.weightstream.dockerfile` removes what is no longer tagged.
LABEL io.weightstream.dockerfile="1"
# A virtual environment works on the official image and on Debian's python3 alike (whose system
# site-packages are marked externally managed).
RUN python3 -m venv /opt/weightstream
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
# the kubernetes extra: `serve --backend kubernetes` (the Helm chart's coordinator) runs from this image
RUN /opt/weightstream/bin/pip install --no-cache-dir --only-binary=:all: ".[kubernetes]" \
 && /opt/weightstream/bin/pip uninstall -y pip \
 && find /opt/weightstream -name '__pycache__' -prune -exec rm -rf {} +

FROM python:3.11-slim
LABEL io.weightstream.dockerfile="1"
COPY --from=build /opt/weightstream /opt/weightstream
ENV PATH=/opt/weightstream/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# the sparse kernels' compiled code: the install is read-only to the user, a pod's /tmp is its writable
# emptyDir (without a writable cache numba compiles in memory in every process: ~4 s, not an error)
ENV NUMBA_CACHE_DIR=/tmp/numba
RUN useradd --create-home --uid 10001 weightstream
USER 10001
WORKDIR /home/weightstream
EXPOSE 50051 8080 50050
# Roles answer their Health RPC on 50051 (the generated pods probe it the same way); for `serve`, whose
# REST API has /healthz, override the check or rely on the chart's probes.
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s CMD ["weightstream", "health"]
ENTRYPOINT ["weightstream"]
CMD ["--help"]
