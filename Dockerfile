# One image for every Spur-Cloud process; docker-compose.yml picks the command.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY spurcloud spurcloud
COPY scheduler scheduler
COPY agents agents
COPY templates templates
COPY static static
COPY manage.py ./
RUN pip install . && useradd --create-home spur
USER spur
