# vmagent: the job service and its workers. No privileges: it reaches machines only
# through vmd's socket.
FROM python:3.11-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml ./
COPY vmagent ./vmagent
COPY vmd ./vmd
# libvirt-python is a dependency of the vmd half of the package; the service never
# imports it, so it is left out here (it needs libvirt headers to build).
RUN pip install --no-cache-dir --no-deps . \
    && pip install --no-cache-dir "pydantic>=2.6" "httpx>=0.27" "ollama>=0.4" "json-repair>=0.30" \
        "fastapi>=0.110" "uvicorn>=0.29" "PyYAML>=6" "Pillow>=10"
RUN useradd --create-home --uid 1001 vmagent && mkdir -p /var/lib/vmagent/service \
    && chown vmagent /var/lib/vmagent/service
USER vmagent
ENV VMAGENT_PROMPTS=/app/configs/agent
EXPOSE 8700
CMD ["python", "-m", "vmagent.service", "--host", "0.0.0.0", "--port", "8700"]
