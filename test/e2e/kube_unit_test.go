package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// These run in `go test ./...` (no build tag, no root): the pure parts of the cluster harness.

func TestBuildDockerfile(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	cases := []struct {
		name, dockerfile string
		wantErr          string // empty: builds
	}{
		{"build stage and scratch image", `# comment
FROM golang:1 AS build
WORKDIR /src
COPY . .
ARG OUT=/out
ARG WORD=default
RUN mkdir -p "${OUT}" && \
    echo "$WORD" > "${OUT}/f"
FROM scratch
ARG OUT=/out
COPY --from=build ${OUT}/f /usr/bin/f
ENTRYPOINT ["/usr/bin/f"]
`, ""},
		{"unknown instruction in the image", "FROM scratch\nADD x /x\n", "not known"},
		{"final stage not scratch", "FROM debian\nCMD [\"sh\"]\n", "FROM scratch"},
		{"copy from an unknown stage", "FROM scratch\nCOPY --from=nowhere /a /a\n", "earlier stage"},
		{"shell-form entrypoint", "FROM golang AS b\nFROM scratch\nENTRYPOINT /bin/x\n", "JSON form"},
		{"failing RUN", "FROM golang AS b\nRUN exit 3\nFROM scratch\n", "exit status 3"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			file := filepath.Join(dir, "Dockerfile")
			if err := os.WriteFile(file, []byte(c.dockerfile), 0o644); err != nil {
				t.Fatal(err)
			}
			img, err := BuildDockerfile(context.Background(), file, dir, "x:1", map[string]string{"OUT": out, "WORD": "given"})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want one saying %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(img.Layers) != 1 || len(img.Entrypoint) != 1 || img.Entrypoint[0] != "/usr/bin/f" {
				t.Fatalf("image %+v", img)
			}
			var body string
			for _, e := range img.Layers[0].entries {
				if e.name == "usr/bin/f" {
					body = string(e.body)
				}
			}
			if body != "given\n" {
				t.Fatalf("usr/bin/f holds %q, want the build arg's value", body)
			}
		})
	}
}

func TestEditManifest(t *testing.T) {
	b, err := os.ReadFile("../../deploy/kubenet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := editManifest(string(b), "localhost/x:1", "10.1.0.0/16,fd00::/56", []string{"--a=1", "--b"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"image: localhost/x:1\n",
		"- --cluster-cidr=10.1.0.0/16,fd00::/56\n",
		// After the manifest's last flag, so that they override it (the agent takes a flag's last
		// value): an E2E_AGENT_ARGS=--network-policy=false must turn enforcement off.
		"            - --a=1\n            - --b\n          env:\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("edited manifest lacks %q:\n%s", want, got)
		}
	}
	if policy, extra := strings.Index(got, "- --network-policy=true"), strings.Index(got, "- --a=1"); policy < 0 || extra < policy {
		t.Errorf("the extra args do not follow --network-policy=true (at %d, extra at %d):\n%s", policy, extra, got)
	}
	if strings.Contains(got, "kubenet-agent:dev") || strings.Contains(got, "10.244.0.0/16") {
		t.Errorf("the original image or CIDR is still there:\n%s", got)
	}
	if _, err := editManifest(string(b)+"\n        image: other\n", "i", "c", nil); err == nil {
		t.Error("a manifest with two image lines was edited")
	}
}
