package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"strings"
	"time"
)

// Image references of the images the runtime tests build. No registry is reachable, so both
// are made locally from Debian's busybox-static and loaded into each runtime's store.
const (
	BusyboxImage = "localhost/kubenet-e2e/busybox:1"
	PauseImage   = "localhost/kubenet-e2e/pause:1"
)

// ServerPort is the port the busybox image's web server listens on inside the pod.
const ServerPort = 8080

// ServerCommand is the busybox image's server: httpd in the foreground serving /www, whose CGI
// script /cgi-bin/from answers "from <client address>" so a test learns which source address
// reached the pod, the way the echo servers of internal/nettest do.
var ServerCommand = []string{"/bin/httpd", "-f", "-p", fmt.Sprint(ServerPort), "-h", "/www"}

// ServerPath is the URL path of the CGI script that names the client's address.
const ServerPath = "/cgi-bin/from"

// fromScript is the CGI script behind ServerPath.
const fromScript = "#!/bin/sh\necho 'Content-Type: text/plain'\necho\necho \"from $REMOTE_ADDR\"\n"

// Image is a single-layer image to be written into a docker-archive tarball.
type Image struct {
	Ref        string
	Entrypoint []string
	Cmd        []string
}

// WriteBusyboxArchive writes a docker-archive tarball (the format of `docker save`, which both
// `ctr images import` and `podman load` read) holding images that all share one layer: the
// static busybox binary at /bin/busybox, a symlink per applet in /bin, and the web root of
// ServerCommand.
func WriteBusyboxArchive(file, busybox string, images ...Image) error {
	layer, err := busyboxLayer(busybox)
	if err != nil {
		return err
	}
	layerSum := sha256.Sum256(layer)
	layerID := hex.EncodeToString(layerSum[:])
	entries := []tarEntry{{name: layerID + "/layer.tar", body: layer, mode: 0o644}}
	type manifestEntry struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	var manifest []manifestEntry
	for _, img := range images {
		config, err := json.Marshal(map[string]any{
			"architecture": "amd64",
			"os":           "linux",
			"created":      time.Unix(0, 0).UTC().Format(time.RFC3339),
			"config": map[string]any{
				"Env":        []string{"PATH=/bin"},
				"Entrypoint": img.Entrypoint,
				"Cmd":        img.Cmd,
				"WorkingDir": "/",
			},
			"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerID}},
		})
		if err != nil {
			return fmt.Errorf("image config of %s: %w", img.Ref, err)
		}
		configSum := sha256.Sum256(config)
		configName := hex.EncodeToString(configSum[:]) + ".json"
		entries = append(entries, tarEntry{name: configName, body: config, mode: 0o644})
		manifest = append(manifest, manifestEntry{Config: configName, RepoTags: []string{img.Ref}, Layers: []string{layerID + "/layer.tar"}})
	}
	body, err := json.Marshal(manifest)
	if err != nil {
		return fmt.Errorf("image manifest: %w", err)
	}
	entries = append(entries, tarEntry{name: "manifest.json", body: body, mode: 0o644})
	archive, err := writeTar(entries)
	if err != nil {
		return err
	}
	if err := os.WriteFile(file, archive, 0o644); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	return nil
}

// busyboxLayer is the shared root filesystem of the test images.
func busyboxLayer(busybox string) ([]byte, error) {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("read busybox (apt-get install busybox-static): %w", err)
	}
	list, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	entries := []tarEntry{
		{name: "bin/", dir: true}, {name: "tmp/", dir: true, mode: 0o1777}, {name: "etc/", dir: true},
		{name: "www/", dir: true}, {name: "www/cgi-bin/", dir: true},
		{name: "bin/busybox", body: bin, mode: 0o755},
		{name: "www/cgi-bin/from", body: []byte(fromScript), mode: 0o755},
		{name: "etc/passwd", body: []byte("root:x:0:0:root:/:/bin/sh\n"), mode: 0o644},
		{name: "etc/group", body: []byte("root:x:0:\n"), mode: 0o644},
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" && !strings.Contains(applet, "/") {
			entries = append(entries, tarEntry{name: "bin/" + applet, link: "busybox"})
		}
	}
	return writeTar(entries)
}

// tarEntry is a file, directory or symlink of a tarball.
type tarEntry struct {
	name string
	body []byte
	mode int64
	dir  bool
	link string // symlink target
}

// writeTar renders entries with fixed owners and times, so the same input gives the same
// digest and a second import of the images is a no-op.
func writeTar(entries []tarEntry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag = tar.TypeDir
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		case e.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", path.Clean(e.name), err)
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, fmt.Errorf("tar %s: %w", path.Clean(e.name), err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("tar: %w", err)
	}
	return buf.Bytes(), nil
}
