# capi-inplace. `make help` lists the targets.
SHELL := /usr/bin/env bash -o pipefail
.DEFAULT_GOAL := help

ROOT := $(abspath .)
BIN  := $(ROOT)/bin
GO   ?= go

# Tool versions (DESIGN.md section 9). Each tool is installed with `go install` from the
# Go module proxy into bin/, under a name that carries its version, so a bump reinstalls.
CONTROLLER_GEN_VERSION := v0.21.0
GOLANGCI_LINT_VERSION  := v2.6.0
KUSTOMIZE_VERSION      := v5.7.0
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
GOLANGCI_LINT  := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
KUSTOMIZE      := $(BIN)/kustomize-$(KUSTOMIZE_VERSION)
export KUSTOMIZE

# The manager binary and image. The Dockerfile runs `make build`, so the image holds
# exactly the binary a developer builds.
VERSION   ?= dev
IMAGE_REPO ?= ghcr.io/capi-inplace/capi-inplace
IMAGE_TAG  ?= $(VERSION)
# IMG is the one image (manager and node program). The version and IMG are stamped into
# the binary: the manager's default --harvester-node-image is IMG, the image docker-build
# builds from this binary, so the Harvester updater's Plans run the node program of the
# manager that wrote them.
IMG       ?= $(IMAGE_REPO):$(IMAGE_TAG)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X main.nodeImage=$(IMG)

# The test control plane: kube-apiserver, etcd and kubectl built from their Go modules
# (hack/tools/*), never downloaded as release binaries.
KUBE_VERSION := v1.36.3
KUBE_MINOR   := 36
TEST_BIN_DIR := $(BIN)/k8s
KUBE_APISERVER := $(TEST_BIN_DIR)/kube-apiserver
ETCD           := $(TEST_BIN_DIR)/etcd
KUBECTL        := $(TEST_BIN_DIR)/kubectl
# kubeadm of the same release, for make check-real-kubeadm only (not a test binary).
KUBEADM        := $(TEST_BIN_DIR)/kubeadm
# helm, built from its Go module (hack/tools/helm): the cluster upgrade Job runs the helm of
# Rancher's installer image, which the tests' simulated image ships as this one.
HELM           := $(TEST_BIN_DIR)/helm
HELM_VERSION   := v3.22.0
KUBE_LDFLAGS   := -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(KUBE_MINOR)
export KUBEBUILDER_ASSETS := $(TEST_BIN_DIR)

# Cluster API's own controllers (core, KubeadmControlPlane, kubeadm bootstrap and CAPD with
# its in-memory backend), built from the module versions in hack/tools/capi/go.mod (the same
# as the project's go.mod; make verify checks it), run as processes by test/capienv.
CAPI_BIN_DIR := $(BIN)/capi
CAPI_BINARIES := $(CAPI_BIN_DIR)/capi-core $(CAPI_BIN_DIR)/capi-kubeadm-control-plane $(CAPI_BIN_DIR)/capi-kubeadm-bootstrap $(CAPI_BIN_DIR)/capd

SUC_APIS_PKG      := github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1
LONGHORN_APIS_PKG := github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2
KUBEVIRT_APIS_PKG := kubevirt.io/api/core/v1
# The KubeVirt kinds the Harvester updater uses. KubeVirt's types carry no kubebuilder
# markers: floats need allowDangerousTypes, and the status subresource that KubeVirt's own
# CRDs give VirtualMachine and VirtualMachineInstanceMigration (not VirtualMachineInstance)
# is added after generation. The install CR KubeVirt has it too (virt-operator's
# pkg/virt-operator/resource/generate/components/crds.go@v1.6.0 NewKubeVirtCrd).
KUBEVIRT_KINDS    := virtualmachines virtualmachineinstances virtualmachineinstancemigrations kubevirts
KUBEVIRT_STATUS   := virtualmachines virtualmachineinstancemigrations kubevirts
# RKE2's helm-controller (HelmChart, HelmChartConfig): its Go module ships its CRDs, generated
# from its types with controller-gen (pkg/crds/yaml/generated); test-crds copies them from the
# module cache without making the module a dependency of the project.
HELM_CONTROLLER_MODULE := github.com/k3s-io/helm-controller@v0.17.9

# Two test targets (docs/testing.md). make test: unit specs and envtest specs of one
# component at a time; make test-e2e: whole runs (the demo, the end-to-end suites, each
# Harvester formation upgraded whole, the bench's smoke run, the randomized safety seeds).
# test/testsuite routes each spec by CAPI_INPLACE_TEST_SCOPE: a Ginkgo spec labelled e2e,
# a plain test that calls testsuite.WholeRun, a suite run by testsuite.RunWhole is a whole
# run. The packages below hold nothing but whole runs, so make test does not build them;
# MIXED_PKGS hold whole runs beside unit specs, so make test-e2e runs them too.
MODULE        := github.com/capi-inplace/capi-inplace
E2E_ONLY_PKGS := ./test/e2e ./test/capie2e ./test/demo ./test/bench
MIXED_PKGS    := ./harvesteradapter ./test/safety
# The slowest packages first: go test starts test binaries in the order it is given them,
# and the one that starts last sets the target's end (harvesteradapter alone runs about
# 10 minutes on 2 cores; started after the others, it ran alone for its last 7).
SLOW_PKGS     := ./harvesteradapter ./harvesteradapter/clusterupgrade ./controllers/upgradetask ./test/sim ./controllers/cascade
TEST_PKGS      = $(SLOW_PKGS:./%=$(MODULE)/%) $(filter-out $(E2E_ONLY_PKGS:./%=$(MODULE)/%) $(SLOW_PKGS:./%=$(MODULE)/%),$(shell $(GO) list ./...))
# Whole runs, the slowest first (harvesteradapter's whole runs, the Rancher endings and
# soak seed among them, take about as long as test/e2e; started after it, they set the end).
E2E_PKGS      := ./harvesteradapter ./test/e2e ./test/demo ./test/capie2e ./test/bench ./test/safety
# Each Ginkgo suite writes its specs' times here, and each test API server the requests it
# served; hack/testsummary prints the slowest specs, every package's time and its requests
# at the end of both targets.
REPORTS       := $(BIN)/test-reports
TESTSUMMARY   := $(BIN)/testsummary
# How many test binaries run at once (go test's -p; its default is the number of cores).
TEST_PARALLEL ?=
TEST_P_FLAG    = $(if $(TEST_PARALLEL),-p $(TEST_PARALLEL))
# A guard against a hung package, not the time a target takes (docs/testing.md has the
# budgets: make test 15 minutes, make test-e2e 20, on a warm 2-core machine). 40m: the
# Harvester adapter's whole runs took 1,405 s in one package on a slowed CI-like machine,
# and a guard that trips on a slow machine proves nothing about the product.
TEST_TIMEOUT ?= 40m

##@ General
.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_0-9-]+:.*##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Build
.PHONY: build
build: ## Build the manager binary (static) into bin/capi-inplace.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/capi-inplace .

# The kubectl plugin: kubectl runs any kubectl-<name> on the PATH as `kubectl <name>`, so
# bin/kubectl-inplace on the PATH is `kubectl inplace` (docs/kubectl-inplace.md). A target
# of its own rather than part of build: the image (which runs make build) does not ship it.
.PHONY: kubectl-inplace
kubectl-inplace: ## Build the kubectl plugin into bin/kubectl-inplace (put bin/ on the PATH for `kubectl inplace`).
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $(BIN)/kubectl-inplace ./cmd/kubectl-inplace

# The container engine: docker if found, else podman; CONTAINER_TOOL=... picks another.
CONTAINER_TOOL ?= $(shell command -v docker >/dev/null 2>&1 && echo docker || { command -v podman >/dev/null 2>&1 && echo podman; })

.PHONY: docker-build
docker-build: ## Build the one image (manager and node program) as $(IMG) with docker or podman (CONTAINER_TOOL).
	@if [ -z "$(CONTAINER_TOOL)" ] || ! command -v "$(CONTAINER_TOOL)" >/dev/null 2>&1; then \
		echo "docker-build: no container engine found (looked for docker and podman; CONTAINER_TOOL='$(CONTAINER_TOOL)'). Install one, or set CONTAINER_TOOL to its command. 'make build' builds the binary without one." >&2; \
		exit 1; \
	fi
	@$(CONTAINER_TOOL) info >/dev/null 2>&1 || { \
		echo "docker-build: $(CONTAINER_TOOL) is installed but its engine does not answer ('$(CONTAINER_TOOL) info' fails): start it (for docker, the daemon), or set CONTAINER_TOOL to another engine." >&2; \
		exit 1; }
	$(CONTAINER_TOOL) build --build-arg VERSION=$(VERSION) --build-arg IMG=$(IMG) --build-arg GOPROXY="$$($(GO) env GOPROXY)" -t $(IMG) .

.PHONY: release-manifests
release-manifests: $(KUSTOMIZE) ## Write clusterctl's out/runtime-extension-components.yaml and out/metadata.yaml.
	@mkdir -p out
	$(KUSTOMIZE) build config/default \
		| sed -e 's|image: $(IMAGE_REPO):dev|image: $${CAPI_INPLACE_IMAGE:=$(IMAGE_REPO):$(IMAGE_TAG)}|' \
		      -e 's|^\(  *\)- --leader-elect$$|&\n\1- --harvester-node-image=$${CAPI_INPLACE_IMAGE:=$(IMAGE_REPO):$(IMAGE_TAG)}|' \
		> out/runtime-extension-components.yaml
	cp metadata.yaml out/metadata.yaml
	@echo "Wrote out/runtime-extension-components.yaml and out/metadata.yaml"

CERT_DIR ?= $(ROOT)/.tilt/certs

.PHONY: run
run: build ## Run the manager against the cluster of $KUBECONFIG (serving certs in $CERT_DIR, made if missing).
	@[ -f "$(CERT_DIR)/tls.crt" ] || $(GO) run ./hack/servingcerts --dir "$(CERT_DIR)"
	$(BIN)/capi-inplace --kubeconfig="$${KUBECONFIG:-$$HOME/.kube/config}" --leader-elect=false \
		--webhook-cert-dir="$(CERT_DIR)" \
		--metrics-bind-address=:8080 --metrics-secure=false $(ARGS)

# The demo's own flags go in ARGS, e.g. make demo ARGS="--via=hook --nodes 5 --fail demo-workers-2";
# make demo ARGS=-help lists them.
.PHONY: demo
demo: test-binaries ## A whole in-place upgrade of simulated Harvester nodes by the real manager, live (ARGS="--via=annotation|hook|capi --nodes N --fail NODE --step-delay 2s --keep").
	@echo "Building the demo into bin/capi-inplace-demo (the first build compiles every dependency: a few minutes on 2 cores, once)..."
	@$(GO) build -o $(BIN)/capi-inplace-demo ./test/demo
	@$(BIN)/capi-inplace-demo $(ARGS)

.PHONY: tilt-certs
tilt-certs: ## Write a self-signed serving certificate for localhost into $CERT_DIR (.tilt/certs) if none is there, and the ExternalUpgradeRequest token (external-hook-token).
	@[ -f "$(CERT_DIR)/tls.crt" ] || $(GO) run ./hack/servingcerts --dir "$(CERT_DIR)"
	@[ -f "$(CERT_DIR)/external-hook-token" ] || (umask 077 && head -c 32 /dev/urandom | base64 > "$(CERT_DIR)/external-hook-token")

##@ Generate
.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code.
	$(CONTROLLER_GEN) object paths=./api/... paths=./harvesteradapter/api/... paths=./harvesteradapter/longhornlive/... paths=./harvesteradapter/harvesterapi/... paths=./harvesteradapter/rancher/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) test-crds ## Generate CRDs and RBAC into config/, and the test CRDs.
	$(CONTROLLER_GEN) crd paths=./api/... paths=./harvesteradapter/api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths=./... output:rbac:artifacts:config=config/rbac

.PHONY: test-crds
test-crds: $(CONTROLLER_GEN) ## Generate the SUC Plan, Longhorn (with its live upgrade), KubeVirt, Harvester (VM backups), Rancher and helm-controller CRDs the test API servers install.
	rm -rf test/crds/suc test/crds/longhorn test/crds/longhorn-liveupgrade test/crds/kubevirt test/crds/harvester test/crds/rancher test/crds/helm
	$(CONTROLLER_GEN) crd:generateEmbeddedObjectMeta=true paths=$(SUC_APIS_PKG) output:crd:dir=test/crds/suc
	$(CONTROLLER_GEN) crd paths=$(LONGHORN_APIS_PKG) output:crd:dir=test/crds/longhorn
	$(CONTROLLER_GEN) crd paths=./harvesteradapter/longhornlive/... output:crd:dir=test/crds/longhorn-liveupgrade
	$(CONTROLLER_GEN) crd paths=./harvesteradapter/harvesterapi/... output:crd:dir=test/crds/harvester
	$(CONTROLLER_GEN) crd paths=./harvesteradapter/rancher/... output:crd:dir=test/crds/rancher
	$(CONTROLLER_GEN) crd:allowDangerousTypes=true paths=$(KUBEVIRT_APIS_PKG) output:crd:dir=test/crds/kubevirt.tmp
	mkdir -p test/crds/kubevirt
	for k in $(KUBEVIRT_KINDS); do mv test/crds/kubevirt.tmp/kubevirt.io_$$k.yaml test/crds/kubevirt/; done
	rm -rf test/crds/kubevirt.tmp
	for k in $(KUBEVIRT_STATUS); do sed -i 's/^    storage: true$$/    storage: true\n    subresources:\n      status: {}/' test/crds/kubevirt/kubevirt.io_$$k.yaml; done
	mkdir -p test/crds/helm
	dir=$$(cd $$(mktemp -d) && go mod download -json $(HELM_CONTROLLER_MODULE) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p') && \
		test -n "$$dir" && install -m 0644 $$dir/pkg/crds/yaml/generated/helm.cattle.io_*.yaml test/crds/helm/

##@ Test
.PHONY: test-binaries
test-binaries: $(KUBE_APISERVER) $(ETCD) $(KUBECTL) $(HELM) $(CAPI_BINARIES) ## Build the test control plane (kube-apiserver, etcd, kubectl), helm into bin/k8s and CAPI's controllers into bin/capi, once.

.PHONY: capi-binaries
capi-binaries: $(CAPI_BINARIES) ## Build Cluster API's controllers (core, KCP, CABPK, CAPD) once into bin/capi.

$(CAPI_BIN_DIR)/capi-core: hack/tools/capi/go.mod hack/tools/capi/go.sum
	@echo "Building Cluster API's core controller from sigs.k8s.io/cluster-api (once; the four CAPI controllers take about 5 minutes on 2 cores)..."
	@mkdir -p $(CAPI_BIN_DIR)
	cd hack/tools/capi && $(GO) build -o $@.tmp sigs.k8s.io/cluster-api/core
	mv $@.tmp $@

$(CAPI_BIN_DIR)/capi-kubeadm-control-plane: hack/tools/capi/go.mod hack/tools/capi/go.sum
	@mkdir -p $(CAPI_BIN_DIR)
	cd hack/tools/capi && $(GO) build -o $@.tmp sigs.k8s.io/cluster-api/controlplane/kubeadm
	mv $@.tmp $@

$(CAPI_BIN_DIR)/capi-kubeadm-bootstrap: hack/tools/capi/go.mod hack/tools/capi/go.sum
	@mkdir -p $(CAPI_BIN_DIR)
	cd hack/tools/capi && $(GO) build -o $@.tmp sigs.k8s.io/cluster-api/bootstrap/kubeadm
	mv $@.tmp $@

$(CAPI_BIN_DIR)/capd: hack/tools/capi/go.mod hack/tools/capi/go.sum
	@mkdir -p $(CAPI_BIN_DIR)
	cd hack/tools/capi && $(GO) build -o $@.tmp sigs.k8s.io/cluster-api/test/infrastructure/docker
	mv $@.tmp $@

$(KUBE_APISERVER): hack/tools/kubernetes/go.mod hack/tools/kubernetes/go.sum
	@echo "Building kube-apiserver $(KUBE_VERSION) from k8s.io/kubernetes (once; about 4 to 8 minutes on 2 cores)..."
	@mkdir -p $(TEST_BIN_DIR)
	cd hack/tools/kubernetes && $(GO) build -o $@.tmp -ldflags "$(KUBE_LDFLAGS)" k8s.io/kubernetes/cmd/kube-apiserver
	mv $@.tmp $@

$(KUBECTL): hack/tools/kubernetes/go.mod hack/tools/kubernetes/go.sum
	@echo "Building kubectl $(KUBE_VERSION) from k8s.io/kubernetes (once; about 2 minutes)..."
	@mkdir -p $(TEST_BIN_DIR)
	cd hack/tools/kubernetes && $(GO) build -o $@.tmp -ldflags "$(KUBE_LDFLAGS)" k8s.io/kubernetes/cmd/kubectl
	mv $@.tmp $@

$(HELM): hack/tools/helm/go.mod hack/tools/helm/go.sum
	@echo "Building helm $(HELM_VERSION) from helm.sh/helm/v3 (once; about 2 minutes)..."
	@mkdir -p $(TEST_BIN_DIR)
	cd hack/tools/helm && $(GO) build -o $@.tmp -ldflags "-X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION)" helm.sh/helm/v3/cmd/helm
	mv $@.tmp $@

$(ETCD): hack/tools/etcd/go.mod hack/tools/etcd/go.sum
	@echo "Building etcd from go.etcd.io/etcd/server/v3 (once; about a minute)..."
	@mkdir -p $(TEST_BIN_DIR)
	cd hack/tools/etcd && $(GO) build -o $@.tmp go.etcd.io/etcd/server/v3
	mv $@.tmp $@

.PHONY: test
test: test-binaries manager-test-binary $(KUSTOMIZE) $(TESTSUMMARY) ## Unit and envtest specs, one component at a time (about 15 minutes); the slowest specs at the end.
	@rm -rf $(REPORTS)/unit
	@echo "go test: unit and envtest specs of $(words $(TEST_PKGS)) packages, -timeout $(TEST_TIMEOUT) -count=1 -json, through $(TESTSUMMARY)"
	@CAPI_INPLACE_TEST_SCOPE=unit CAPI_INPLACE_MANAGER_BINARY=$(MANAGER_TEST_BIN) CAPI_INPLACE_SPEC_REPORTS=$(REPORTS)/unit/specs CAPI_INPLACE_REQUEST_COUNTS=$(REPORTS)/unit/requests \
		$(GO) test $(TEST_PKGS) $(TEST_P_FLAG) -timeout $(TEST_TIMEOUT) -count=1 -json 2>&1 \
		| $(TESTSUMMARY) -reports $(REPORTS)/unit/specs -requests $(REPORTS)/unit/requests

.PHONY: test-e2e
test-e2e: test-binaries manager-test-binary $(KUSTOMIZE) $(TESTSUMMARY) ## Whole runs: demo, e2e, CAPI's controllers, formations, bench smoke, safety seeds (about 20 minutes).
	@rm -rf $(REPORTS)/e2e
	@echo "go test: whole runs of $(words $(E2E_PKGS)) packages, -timeout $(TEST_TIMEOUT) -count=1 -json, through $(TESTSUMMARY)"
	@CAPI_INPLACE_TEST_SCOPE=e2e CAPI_INPLACE_MANAGER_BINARY=$(MANAGER_TEST_BIN) CAPI_INPLACE_SPEC_REPORTS=$(REPORTS)/e2e/specs CAPI_INPLACE_REQUEST_COUNTS=$(REPORTS)/e2e/requests \
		$(GO) test $(E2E_PKGS) $(TEST_P_FLAG) -timeout $(TEST_TIMEOUT) -count=1 -json 2>&1 \
		| $(TESTSUMMARY) -reports $(REPORTS)/e2e/specs -requests $(REPORTS)/e2e/requests

# The manager the suites and demo runs start (test/manager.Build returns it): linked once
# per target instead of once per suite and demo run; go build relinks only what changed.
MANAGER_TEST_BIN := $(abspath $(BIN))/test-manager/capi-inplace
.PHONY: manager-test-binary
manager-test-binary: ## Build the manager the tests run into bin/test-manager.
	@mkdir -p $(dir $(MANAGER_TEST_BIN))
	$(GO) build -o $(MANAGER_TEST_BIN) .

$(TESTSUMMARY): hack/testsummary/main.go
	@mkdir -p $(BIN)
	$(GO) build -o $@ ./hack/testsummary

# The bench's own flags go in ARGS, e.g. make bench ARGS="--sections hooks --hook-duration 10s";
# ARGS=-help lists them. make test-e2e runs only a smoke run of it (test/bench TestSmoke).
.PHONY: bench
bench: test-binaries ## Measure the hook server, orchestration, API writes per node and manager memory; print the figures and write docs/benchmarks.md.
	@echo "Building the bench into bin/capi-inplace-bench..."
	@$(GO) build -o $(BIN)/capi-inplace-bench ./test/bench
	$(BIN)/capi-inplace-bench --out docs/benchmarks.md $(ARGS)

# The randomized safety tests: make test-e2e runs their fixed seeds; make soak runs SEEDS
# seeds (from SEED_BASE) of each, printing a line per seed and a summary. A violation prints
# the seed and its history, SAFETY_SEED=<seed> replays it. test/safety runs the task
# controllers over a test updater; the Rancher route's soak (harvesteradapter, label
# rancher-soak) runs a Harvester cluster whose RKE2 Rancher provisions under randomized
# endings, in SOAK_JOBS processes (hack/rancher-soak.sh). SOAK=safety or SOAK=rancher runs
# one of them.
SEEDS     ?= 100
SEED_BASE ?= 1
SOAK      ?= safety rancher
SOAK_JOBS ?= 2

.PHONY: soak
soak: test-binaries ## Run the randomized safety tests (test/safety, the Rancher route's) for SEEDS seeds (default 100) from SEED_BASE; a violation prints its seed and history.
	@if echo "$(SOAK)" | grep -qw safety; then \
		SAFETY_SEEDS=$(SEEDS) SAFETY_SEED_BASE=$(SEED_BASE) $(GO) test ./test/safety -run '^TestSafety$$' -count=1 -v -timeout 0 \
			| grep -v -e '^=== RUN' -e '^E[0-9]\{4\} '; fi
	@if echo "$(SOAK)" | grep -qw rancher; then \
		SEEDS=$(SEEDS) SEED_BASE=$(SEED_BASE) JOBS=$(SOAK_JOBS) GO=$(GO) bash hack/rancher-soak.sh; fi

REAL_SUC_SRC ?=
.PHONY: check-real-suc
check-real-suc: test-binaries ## By hand, never in make test or CI: build SUC from a checkout (REAL_SUC_SRC) and check test/sim's SUC against it.
	@test -n "$(REAL_SUC_SRC)" || { echo "set REAL_SUC_SRC to a checkout of rancher/system-upgrade-controller (commit f1362a3, the one shared/facts/suc.md describes)" >&2; exit 2; }
	cd "$(REAL_SUC_SRC)" && $(GO) build -o "$(CURDIR)/bin/real-suc" .
	REAL_SUC="$(CURDIR)/bin/real-suc" KUBEBUILDER_ASSETS="$(CURDIR)/bin/k8s" $(GO) test -tags realsuc ./harvesteradapter -run '^TestRealSUC$$' -count=1 -v

# Prometheus, for a by-hand check of the Prometheus health gate: its module (no replace
# directives) builds with `go install pkg@version` from the Go module proxy. Upstream builds
# with the tags netgo and builtinassets; builtinassets needs the web UI built by npm, which
# the module does not ship, so this binary serves the HTTP API without the UI. The gate
# needs no service discovery: remove_all_sd (Prometheus's README, "Service discovery
# plugins") leaves out the optional ones and about a third of the packages to compile.
PROMETHEUS_MODULE_VERSION := v0.316.0
PROMETHEUS_VERSION        := 3.16.0
PROMETHEUS := $(BIN)/prometheus-$(PROMETHEUS_MODULE_VERSION)/prometheus

$(PROMETHEUS):
	@echo "Building Prometheus $(PROMETHEUS_VERSION) from github.com/prometheus/prometheus@$(PROMETHEUS_MODULE_VERSION) (once; about 6.5 minutes on 2 cores)..."
	GOBIN="$(dir $@)" $(GO) install -tags netgo,remove_all_sd -ldflags "-X github.com/prometheus/common/version.Version=$(PROMETHEUS_VERSION)" github.com/prometheus/prometheus/cmd/prometheus@$(PROMETHEUS_MODULE_VERSION)

# The check also starts a test API server: it needs `make test-binaries` once (it says so
# when they are missing). It does not depend on them, so that no rebuild starts here.
.PHONY: check-real-prometheus
check-real-prometheus: $(PROMETHEUS) ## By hand, never in make test or CI: build Prometheus from the module proxy and run the Prometheus health gate against it.
	REAL_PROMETHEUS="$(PROMETHEUS)" KUBEBUILDER_ASSETS="$(CURDIR)/bin/k8s" $(GO) test -tags realprometheus ./controllers/healthgate -run '^TestRealPrometheus$$' -count=1 -v

# kubeadm at KUBE_VERSION, from the k8s.io/kubernetes module that builds kube-apiserver
# (hack/tools/kubernetes): most of its packages are already in Go's build cache once the
# test control plane is built. CGO_ENABLED=0 as Kubernetes builds its release kubeadm
# (static), so that it runs chrooted into a fake node root with no libraries in it.
$(KUBEADM): hack/tools/kubernetes/go.mod hack/tools/kubernetes/go.sum
	@echo "Building kubeadm $(KUBE_VERSION) from k8s.io/kubernetes (once; about 250 s of CPU, 2 to 9 minutes on 2 cores)..."
	@mkdir -p $(TEST_BIN_DIR)
	cd hack/tools/kubernetes && CGO_ENABLED=0 $(GO) build -o $@.tmp -ldflags "$(KUBE_LDFLAGS)" k8s.io/kubernetes/cmd/kubeadm
	mv $@.tmp $@

# The check runs the real kubeadm's `upgrade plan` and the node program's `node kubeadm
# upgrade` with kubeadm's --dry-run against a test API server made to look like a kubeadm
# cluster (docs/kubeadm.md, "Checked against the real kubeadm"). It must run as root:
# kubeadm's preflight refuses anyone else, and each fake node root is entered with
# chroot(2). It needs make test-binaries once and does not depend on them, like
# check-real-prometheus.
.PHONY: check-real-kubeadm
check-real-kubeadm: $(KUBEADM) ## By hand, as root, never in make test or CI: build kubeadm $(KUBE_VERSION) from the module proxy and check the node program's kubeadm commands and the version rules against it.
	REAL_KUBEADM="$(KUBEADM)" KUBEBUILDER_ASSETS="$(CURDIR)/bin/k8s" $(GO) test -tags realkubeadm ./nodeprogram -run '^TestRealKubeadm$$' -count=1 -v

FUZZTIME ?= 1m
FUZZ_TARGETS := ./api/v1alpha1:FuzzParseUpdaterReference ./harvesteradapter/releases:FuzzReleaseMetadata ./controllers/upgraderequest:FuzzNames ./extension:FuzzJudgeVersion ./extension:FuzzCoverPatch ./extension:FuzzHookBodies

.PHONY: fuzz
fuzz: ## Run each fuzz target for $(FUZZTIME) (make test runs their seeds).
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; name=$${t##*:}; \
		echo "== $$name ($$pkg) for $(FUZZTIME)"; \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) || exit 1; done

##@ Checks
.PHONY: lint
lint: $(GOLANGCI_LINT) ## gofmt, go vet and golangci-lint.
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GOLANGCI_LINT) run ./...

.PHONY: verify
verify: generate manifests ## Fail if regenerating changes anything checked in, or go.mod is not tidy.
	@$(GO) mod tidy -diff || { echo "go.mod or go.sum is not tidy; run 'go mod tidy' and commit"; exit 1; }
	@for m in sigs.k8s.io/cluster-api sigs.k8s.io/cluster-api/test; do \
		a=$$(awk -v m=$$m '$$1==m {print $$2}' go.mod); b=$$(awk -v m=$$m '$$1==m {print $$2}' hack/tools/capi/go.mod); \
		[ -n "$$a" ] && [ "$$a" = "$$b" ] || { echo "$$m is $$a in go.mod but $$b in hack/tools/capi/go.mod: the CAPI controllers the tests run must be the release the project builds against; set both to the same version"; exit 1; }; done
	@if [ -n "$$(git status --porcelain)" ]; then \
		echo "Generated files are out of date; run 'make generate manifests' and commit:"; \
		git status --porcelain; git diff --stat; exit 1; fi
	@echo "Generated files are up to date."

##@ Tools
$(CONTROLLER_GEN):
	@mkdir -p $(BIN)/.tmp-controller-gen
	GOBIN=$(BIN)/.tmp-controller-gen $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(BIN)/.tmp-controller-gen/controller-gen $@ && rm -rf $(BIN)/.tmp-controller-gen

$(KUSTOMIZE):
	@mkdir -p $(BIN)/.tmp-kustomize
	GOBIN=$(BIN)/.tmp-kustomize $(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
	mv $(BIN)/.tmp-kustomize/kustomize $@ && rm -rf $(BIN)/.tmp-kustomize

$(GOLANGCI_LINT):
	@mkdir -p $(BIN)/.tmp-golangci-lint
	GOBIN=$(BIN)/.tmp-golangci-lint $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/.tmp-golangci-lint/golangci-lint $@ && rm -rf $(BIN)/.tmp-golangci-lint
