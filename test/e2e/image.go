package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
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
// reached the pod, the way the echo servers of test/nettest do.
var ServerCommand = []string{"/bin/httpd", "-f", "-p", fmt.Sprint(ServerPort), "-h", "/www"}

// ServerPath is the URL path of the CGI script that names the client's address.
const ServerPath = "/cgi-bin/from"

// fromScript is the CGI script behind ServerPath.
const fromScript = "#!/bin/sh\necho 'Content-Type: text/plain'\necho\necho \"from $REMOTE_ADDR\"\n"

// Image is an image to be written into a docker-archive tarball: its layers, bottom first, and
// the parts of its configuration a runtime reads.
type Image struct {
	Ref string
	// Aliases are further names of the same image (more RepoTags of one archive entry).
	Aliases    []string
	Entrypoint []string
	Cmd        []string
	Env        []string // default: PATH=/bin
	Layers     []*Layer
}

// Layer is the content of one image layer: directories, files and symlinks, in the order they
// were added (a directory before what it holds).
type Layer struct {
	entries []tarEntry
	names   map[string]bool
}

// NewLayer returns an empty layer.
func NewLayer() *Layer { return &Layer{names: map[string]bool{}} }

func (l *Layer) add(e tarEntry) {
	name := strings.TrimSuffix(e.name, "/")
	if l.names[name] {
		return
	}
	// Parents first, as a real layer lists them.
	if dir := path.Dir(name); dir != "." && !l.names[dir] {
		l.Dir(dir, 0o755)
	}
	l.names[name] = true
	l.entries = append(l.entries, e)
}

// Dir adds directory name (no leading slash) with mode.
func (l *Layer) Dir(name string, mode int64) {
	l.add(tarEntry{name: strings.TrimSuffix(name, "/") + "/", dir: true, mode: mode})
}

// File adds a regular file.
func (l *Layer) File(name string, body []byte, mode int64) {
	l.add(tarEntry{name: name, body: body, mode: mode})
}

// Symlink adds name pointing at target.
func (l *Layer) Symlink(name, target string) { l.add(tarEntry{name: name, link: target}) }

// CopyFile adds the machine's file src (following symlinks) as name, with src's permissions.
func (l *Layer) CopyFile(src, name string) error {
	body, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("image layer: %w", err)
	}
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("image layer: %w", err)
	}
	l.File(name, body, int64(st.Mode().Perm()))
	return nil
}

// CopyProgram adds the machine's dynamically linked program src as name together with every
// shared library ldd names for it (at the paths ldd names, the dynamic loader among them), so
// the program runs in an image without a base system.
func (l *Layer) CopyProgram(src, name string) error {
	if err := l.CopyFile(src, name); err != nil {
		return err
	}
	out, err := exec.Command("ldd", src).Output()
	if err != nil {
		return fmt.Errorf("ldd %s: %w", src, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				if err := l.CopyFile(f, strings.TrimPrefix(f, "/")); err != nil {
					return fmt.Errorf("library of %s: %w", src, err)
				}
				break
			}
		}
	}
	return nil
}

// BusyboxLayer is a root filesystem made of the static busybox binary at /bin/busybox and a
// symlink per applet in /bin, except the applets in except (the caller supplies those), plus
// /tmp, /etc/passwd and /etc/group.
func BusyboxLayer(busybox string, except ...string) (*Layer, error) {
	l := NewLayer()
	if err := l.CopyFile(busybox, "bin/busybox"); err != nil {
		return nil, fmt.Errorf("%w (apt-get install busybox-static)", err)
	}
	list, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	l.Dir("tmp", 0o1777)
	l.File("etc/passwd", []byte("root:x:0:0:root:/:/bin/sh\n"), 0o644)
	l.File("etc/group", []byte("root:x:0:\n"), 0o644)
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" && !strings.Contains(applet, "/") && !slices.Contains(except, applet) {
			l.Symlink("bin/"+applet, "busybox")
		}
	}
	return l, nil
}

// WriteBusyboxArchive writes a docker-archive tarball holding images that all share one
// layer: BusyboxLayer plus the web root of ServerCommand. Images given with layers keep them.
func WriteBusyboxArchive(file, busybox string, images ...Image) error {
	layer, err := BusyboxLayer(busybox)
	if err != nil {
		return err
	}
	layer.File("www/cgi-bin/from", []byte(fromScript), 0o755)
	for i := range images {
		if len(images[i].Layers) == 0 {
			images[i].Layers = []*Layer{layer}
		}
	}
	return WriteArchive(file, images...)
}

// WriteArchive writes a docker-archive tarball (the format of `docker save`, which both `ctr
// images import` and `podman load` read) holding images. A layer shared by several images is
// stored once.
func WriteArchive(file string, images ...Image) error {
	var entries []tarEntry
	stored := map[string]bool{}
	type manifestEntry struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	var manifest []manifestEntry
	for _, img := range images {
		var diffIDs, layerFiles []string
		for _, l := range img.Layers {
			body, err := writeTar(l.entries)
			if err != nil {
				return fmt.Errorf("layer of %s: %w", img.Ref, err)
			}
			sum := sha256.Sum256(body)
			id := hex.EncodeToString(sum[:])
			if !stored[id] {
				stored[id] = true
				entries = append(entries, tarEntry{name: id + "/layer.tar", body: body, mode: 0o644})
			}
			diffIDs = append(diffIDs, "sha256:"+id)
			layerFiles = append(layerFiles, id+"/layer.tar")
		}
		env := img.Env
		if env == nil {
			env = []string{"PATH=/bin"}
		}
		config, err := json.Marshal(map[string]any{
			"architecture": "amd64",
			"os":           "linux",
			"created":      time.Unix(0, 0).UTC().Format(time.RFC3339),
			"config": map[string]any{
				"Env":        env,
				"Entrypoint": img.Entrypoint,
				"Cmd":        img.Cmd,
				"WorkingDir": "/",
			},
			"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
		})
		if err != nil {
			return fmt.Errorf("image config of %s: %w", img.Ref, err)
		}
		configSum := sha256.Sum256(config)
		configName := hex.EncodeToString(configSum[:]) + ".json"
		entries = append(entries, tarEntry{name: configName, body: config, mode: 0o644})
		manifest = append(manifest, manifestEntry{Config: configName, RepoTags: append([]string{img.Ref}, img.Aliases...), Layers: layerFiles})
	}
	body, err := json.Marshal(manifest)
	if err != nil {
		return fmt.Errorf("image manifest: %w", err)
	}
	entries = append(entries, tarEntry{name: "manifest.json", body: body, mode: 0o644})
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	defer f.Close()
	if err := writeTarTo(f, entries); err != nil {
		return fmt.Errorf("write image archive %s: %w", file, err)
	}
	return f.Close()
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
	if err := writeTarTo(&buf, entries); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeTarTo(w io.Writer, entries []tarEntry) error {
	tw := tar.NewWriter(w)
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
			return fmt.Errorf("tar %s: %w", path.Clean(e.name), err)
		}
		if _, err := tw.Write(e.body); err != nil {
			return fmt.Errorf("tar %s: %w", path.Clean(e.name), err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("tar: %w", err)
	}
	return nil
}
