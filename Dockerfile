# Image for dradriver-kubeletplugin and dradriver-controller (manifests use dradriver:0.1.0).
# Not built by CI here (no container engine on the build machines); build with
#   docker build -t dradriver:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dradriver dradriver
COPY controller controller
COPY kubeletplugin kubeletplugin
RUN pip install --no-cache-dir grpcio-tools \
 && python -m dradriver.kubeletapi.generate --force \
 && pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 0
ENTRYPOINT ["dradriver-kubeletplugin"]
