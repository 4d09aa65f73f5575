package e2e

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

func TestPolicyEnforced(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{nil, true}, // the manifest's --network-policy=true
		{[]string{"--stale-gc-grace=30s"}, true},
		{[]string{"--network-policy=false"}, false},
		{[]string{"-network-policy=0"}, false},
		{[]string{"--network-policy=false", "--network-policy"}, true},
		{[]string{"--network-policy=false", "--network-policy=true"}, true},
		{[]string{"--network-policy=true", "--network-policy=false"}, false},
		{[]string{"--network-policy-resync=1m"}, true},
	} {
		if got := policyEnforced(c.args); got != c.want {
			t.Errorf("policyEnforced(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}

func TestCyclonusJUnit(t *testing.T) {
	// As cyclonus v0.5.6 writes it (go-junit-report's formatter): tests="0" always.
	report := func(failures int, cases ...string) string {
		s := fmt.Sprintf("<testsuite tests=\"0\" failures=\"%d\" time=\"\" name=\"cyclonus\">\n    <properties></properties>\n", failures)
		for _, c := range cases {
			name, failed := strings.CutSuffix(c, "!")
			s += fmt.Sprintf("    <testcase classname=\"\" name=%q time=\"\">\n", name)
			if failed {
				s += "        <failure message=\"\" type=\"\"></failure>\n"
			}
			s += "    </testcase>\n"
		}
		return s + "</testsuite>"
	}
	for _, c := range []struct {
		name, report   string
		passed, failed int
		failedCases    []string
		wantErr        bool
	}{
		{"all passed", report(0, "ingress: deny all", "egress: deny all"), 2, 0, nil, false},
		{"failures numbered in run order", report(2, "simple ipblock", "ipblock with except!", "simple ipblock!"), 1, 2,
			[]string{"#2 ipblock with except", "#3 simple ipblock"}, false},
		{"count disagrees with the cases", report(1, "a", "b"), 0, 0, nil, true},
		{"no case", report(0), 0, 0, nil, true},
		{"not a report", "SummaryTable:", 0, 0, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r CyclonusResult
			err := r.parseJUnit([]byte(c.report))
			if c.wantErr {
				if err == nil {
					t.Fatalf("no error; parsed %+v", r)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Passed != c.passed || r.Failed != c.failed || !slices.Equal(r.FailedCases, c.failedCases) {
				t.Errorf("parsed %d passed, %d failed %q; want %d, %d %q", r.Passed, r.Failed, r.FailedCases, c.passed, c.failed, c.failedCases)
			}
		})
	}
}

func TestWriteArchiveAliases(t *testing.T) {
	file := filepath.Join(t.TempDir(), "images.tar")
	l := NewLayer()
	l.File("f", []byte("x"), 0o644)
	err := WriteArchive(file, Image{Ref: "registry.example/a:2", Aliases: []string{"registry.example/a:1"}, Layers: []*Layer{l}},
		Image{Ref: "registry.example/b:1", Layers: []*Layer{l}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no manifest.json: %v", err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var manifest []struct{ RepoTags []string }
		if err := json.NewDecoder(tr).Decode(&manifest); err != nil {
			t.Fatal(err)
		}
		if len(manifest) != 2 || !slices.Equal(manifest[0].RepoTags, []string{"registry.example/a:2", "registry.example/a:1"}) ||
			!slices.Equal(manifest[1].RepoTags, []string{"registry.example/b:1"}) {
			t.Errorf("RepoTags %+v, want both names of a, then b's one", manifest)
		}
		return
	}
}
