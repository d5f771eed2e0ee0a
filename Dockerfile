# syntax=docker/dockerfile:1
# The capi-inplace image: one static binary on a distroless, non-root base, the manager
# and (`capi-inplace node ...`) the node program, which needs nothing else in the image:
# it runs the host's own tools through the host root (docs/harvester.md, "The node program").

ARG GO_VERSION=1.26
FROM golang:${GO_VERSION} AS builder
# Go module proxy settings, for builds behind a proxy or in an air-gapped network.
ARG GOPROXY
ARG GOSUMDB
ARG GOPRIVATE
ARG VERSION=dev
# The image's own reference, stamped into the binary as the manager's default
# --harvester-node-image (Makefile, IMG); empty keeps the binary's built-in default.
ARG IMG=
WORKDIR /workspace
# Dependencies first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The same build a developer runs: `make build` (static, trimmed, version and image stamped).
RUN make build VERSION=${VERSION} ${IMG:+IMG=${IMG}}

FROM gcr.io/distroless/static:nonroot
LABEL org.opencontainers.image.source="https://github.com/capi-inplace/capi-inplace" \
      org.opencontainers.image.description="capi-inplace: in-place upgrades for Cluster API machines"
COPY --from=builder /workspace/bin/capi-inplace /capi-inplace
USER 65532:65532
ENTRYPOINT ["/capi-inplace"]
