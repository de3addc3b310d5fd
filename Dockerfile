# syntax=docker/dockerfile:1
# ratelimit-authz image for users who build with a container engine:
#   docker build --build-arg VERSION=$(git describe --tags --always) -t ratelimit-authz .
# It holds the same files as `make image` (which needs no engine and is
# reproducible): the static binary, the shipped configuration, CA
# certificates (Go's x509roots bundle of Mozilla's trust store), and the
# passwd/group entries of the non-root user 65532, on an empty base: no
# shell, no package manager. The root filesystem is written by the same
# tool (deploy/cmd/build-image), so both ways ship the same bytes.
# deploy/image/dockerfile_test.go keeps the lines below in step with it.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
COPY deploy/go.mod deploy/go.sum ./deploy/
RUN go mod download && go -C deploy mod download
COPY . .
ARG VERSION=dev
ARG REVISION=unknown
ARG LICENSE=NOASSERTION
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/ratelimit-authz ./cmd/ratelimit-authz \
 && go -C deploy run ./cmd/build-image --binary /out/ratelimit-authz --config /src/config/ratelimit.yaml \
      --version "${VERSION}" --revision "${REVISION}" --license "${LICENSE}" \
      --layout "" --tarball "" --layer-tar /out/rootfs.tar \
 && mkdir /rootfs && tar -xpf /out/rootfs.tar -C /rootfs

# The example application behind Envoy in docker-compose.yaml.
FROM golang:1.26 AS exampleapp-build
WORKDIR /src
COPY --from=build /src /src
RUN CGO_ENABLED=0 go -C deploy build -trimpath -o /out/exampleapp ./cmd/exampleapp

FROM scratch AS exampleapp
COPY --from=exampleapp-build /out/exampleapp /exampleapp
USER 65532:65532
EXPOSE 8080/tcp
ENTRYPOINT ["/exampleapp", "--addr", "0.0.0.0:8080"]

# The server: the default target (the last stage).
FROM scratch AS server
ARG VERSION=dev
ARG REVISION=unknown
ARG LICENSE=NOASSERTION
COPY --from=build /rootfs/ /
COPY --from=build --chown=65532:65532 /rootfs/var/lib/ratelimit-authz/ /var/lib/ratelimit-authz/
LABEL org.opencontainers.image.title="ratelimit-authz" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/ratelimit-authz/ratelimit-authz" \
      org.opencontainers.image.licenses="${LICENSE}" \
      org.opencontainers.image.base.name="scratch"
ENV RATELIMIT_AUTHZ_CONFIG=/etc/ratelimit-authz/ratelimit.yaml
ENV RATELIMIT_AUTHZ_GRPC_ADDR=0.0.0.0:9001
ENV RATELIMIT_AUTHZ_CHECK_ADDR=0.0.0.0:9002
ENV RATELIMIT_AUTHZ_HTTP_ADDR=0.0.0.0:9090
USER 65532:65532
WORKDIR /
EXPOSE 9001/tcp 9002/tcp 9090/tcp
STOPSIGNAL SIGTERM
ENTRYPOINT ["/ratelimit-authz", "serve"]
