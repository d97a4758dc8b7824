# vipkit: `make test` works on a fresh Debian machine by itself: it installs
# the system packages the tests need when they are missing, then runs every
# test with the race detector.

GO ?= go
TESTFLAGS ?=

.PHONY: test deps demo lint lockorder cross importer-check build install

deps:
	@bash scripts/deps.sh

# The end-to-end packages run real-time clusters in network namespaces
# (wireguard-go, etcd members, agents); on 2 cores they run after the rest,
# one at a time, so that no other test binary starves their timers.
E2E := ./examples/keel-vip ./examples/tsng

# Both steps always run, so that a failure in one package does not hide
# another's; the target fails at the end if either failed.
test: deps
	@rc=0; \
	$(GO) test -race -timeout 60m $(TESTFLAGS) $$($(GO) list ./... | grep -v -e /examples/keel-vip -e /examples/tsng) || rc=1; \
	$(GO) test -race -timeout 30m -p 1 $(TESTFLAGS) $(E2E) || rc=1; \
	if [ $$rc -ne 0 ]; then echo "make test: FAILED (see the FAIL lines above)"; fi; \
	exit $$rc

# The unit packages once more with every vipkit mutex checking lock order
# (internal/syncx, go-deadlock): an ABBA inversion stops the binary with
# both stacks even when the run did not hang. No race detector (the checker
# is the point, and it would double the cost).
lockorder:
	$(GO) test -tags vipkit_lockorder -timeout 30m $(TESTFLAGS) $$($(GO) list ./... | grep -v -e /examples/keel-vip -e /examples/tsng)

demo:
	$(GO) run ./cmd/tsng demo

# gVisor's checklocks analyzer checks the +checklocks annotations on guarded
# fields (docs/locking.md). gVisor has no tags; this pseudo-version of its go
# branch builds with Go 1.26 and its own pinned x/tools.
CHECKLOCKS_VERSION := v0.0.0-20260905035102-160fafc42237
CHECKLOCKS = $$($(GO) env GOPATH)/bin/checklocks

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	@command -v staticcheck >/dev/null 2>&1 || GOFLAGS= $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck ./...
	@$(GO) version -m "$(CHECKLOCKS)" 2>/dev/null | grep -q "gvisor.dev/gvisor[[:space:]]*$(CHECKLOCKS_VERSION)" || GOFLAGS= $(GO) install gvisor.dev/gvisor/tools/checklocks/cmd/checklocks@$(CHECKLOCKS_VERSION)
	$(GO) vet -vettool="$(CHECKLOCKS)" ./...

# The library packages build and vet (tests included) for every GOOS/GOARCH
# an importer may target; see scripts/cross-check.sh.
cross:
	@bash scripts/cross-check.sh

# Fresh importer modules outside the repository: each public package, all,
# and every ordered pair of the heavy ones; see scripts/importer-check.sh.
importer-check:
	@bash scripts/importer-check.sh

# Install: `make install` builds tsng, keel-vip and sharehosts and installs
# them in $(BINDIR), and the systemd units in $(UNITDIR) with their
# ExecStart (ExecStartPre, ExecReload, ExecStopPost) pointed at
# $(BINDIR): the units in the tree name /usr/bin, which PREFIX=/usr
# keeps. DESTDIR stages the whole tree elsewhere (packaging, CI); the
# paths written into the units never include it. tsng's optional
# drop-ins (tun mode, reload credentials) go to $(SHAREDIR)/systemd, not
# beside the units, where systemd would apply them: copy the one you want
# to /etc/systemd/system/tsng.service.d/. NOBUILD=1 installs what an
# earlier `make build` left in $(BUILDDIR), for a root without Go:
# `make build && sudo make install NOBUILD=1`.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
UNITDIR ?= $(PREFIX)/lib/systemd/system
SHAREDIR ?= $(PREFIX)/share/vipkit
DESTDIR ?=
BINARIES := tsng keel-vip sharehosts
UNITS := examples/tsng/systemd/tsng.service \
	examples/keel-vip/systemd/keel-vip.service \
	examples/keel-vip/systemd/keel-vip-control.service \
	examples/keel-vip/systemd/keel-vip-members.service
DROPINS := examples/tsng/systemd/tsng.service.d/tun.conf \
	examples/tsng/systemd/tsng.service.d/reload-credentials.conf

# The binaries, in $(BUILDDIR) (bin/ of the tree).
BUILDDIR ?= bin
build:
	@mkdir -p "$(BUILDDIR)"
	$(GO) build -o "$(BUILDDIR)/" $(addprefix ./cmd/,$(BINARIES))

ifeq ($(NOBUILD),)
install: build
endif
install:
	@for b in $(BINARIES); do test -x "$(BUILDDIR)/$$b" || { echo "make install: $(BUILDDIR)/$$b is missing (run make build first)"; exit 1; }; done
	install -d -m 0755 "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(UNITDIR)" "$(DESTDIR)$(SHAREDIR)/systemd/tsng.service.d"
	install -m 0755 $(addprefix $(BUILDDIR)/,$(BINARIES)) "$(DESTDIR)$(BINDIR)/"
	@set -e; for u in $(UNITS); do \
		sed 's|^\(Exec[A-Za-z]*=[-@:+!]*\)/usr/bin/|\1$(BINDIR)/|' "$$u" >"$(DESTDIR)$(UNITDIR)/$$(basename "$$u").tmp"; \
		chmod 0644 "$(DESTDIR)$(UNITDIR)/$$(basename "$$u").tmp"; \
		mv "$(DESTDIR)$(UNITDIR)/$$(basename "$$u").tmp" "$(DESTDIR)$(UNITDIR)/$$(basename "$$u")"; \
		echo "installed $(DESTDIR)$(UNITDIR)/$$(basename "$$u")"; \
	done
	install -m 0644 $(DROPINS) "$(DESTDIR)$(SHAREDIR)/systemd/tsng.service.d/"
