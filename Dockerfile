# One image for every weightstream role; the command picks the role.
# Build: podman build --network host -t weightstream:dev .   (or docker build -t weightstream:dev .)
FROM python:3.11-slim AS build
# A virtual environment, so the same steps work on the official image and on Debian's python3
# (whose system site-packages are marked externally managed).
RUN python3 -m venv /opt/weightstream
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
RUN /opt/weightstream/bin/pip install --no-cache-dir .

FROM python:3.11-slim
COPY --from=build /opt/weightstream /opt/weightstream
ENV PATH=/opt/weightstream/bin:$PATH PYTHONUNBUFFERED=1
RUN useradd --create-home --uid 10001 weightstream
USER weightstream
WORKDIR /home/weightstream
ENTRYPOINT ["weightstream"]
CMD ["--help"]
