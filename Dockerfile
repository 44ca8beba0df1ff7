# syntax=docker/dockerfile:1
# Build stage: compilers live here only.
FROM python:3.11-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/venv/bin/pip install --no-cache-dir .

# Runtime stage: the virtual environment, the migrations, a non-root user.
FROM python:3.11-slim
RUN useradd --system --uid 10001 --create-home --home-dir /app mao
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY --chown=mao:mao migrations ./migrations
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    MEMORY_HTTP_HOST=0.0.0.0 \
    MEMORY_HTTP_PORT=8080 \
    MEMORY_OPS_PORT=8081
USER mao
# 8081: /healthz, /readyz and /metrics on slots of their own (docs/operations.md, "Ports and probes").
EXPOSE 8080 8081
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
  CMD python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8081/healthz', timeout=2).status != 200)"
ENTRYPOINT ["mao-memory"]
CMD ["run"]
