package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// BuildDockerfile builds the image a Dockerfile describes without a docker engine (none exists
// here), so that the image a test runs is made by the recipe users build with `docker build`.
// It knows the few instructions kubenet's recipes use and refuses every other one, so a recipe
// that outgrows it fails here rather than being tested as something it is not:
//
//   - build stages (every stage but the last): FROM any image, WORKDIR, COPY from the context,
//     ARG, ENV and RUN. The context is the directory the RUN lines run in (the checkout), so
//     WORKDIR and COPY have nothing left to do; RUN runs `sh -c` with the stage's ARG and ENV
//     values in its environment, on this machine's toolchain instead of the stage's image;
//   - the last stage: FROM scratch, ARG, ENV, COPY --from=<build stage> (one layer each),
//     ENTRYPOINT and CMD in their JSON form.
//
// args are the --build-arg values. An ARG whose value names where a build stage leaves files
// (the recipes' OUT) must be given a directory of the caller's: the RUN lines write there.
func BuildDockerfile(ctx context.Context, dockerfile, contextDir, ref string, args map[string]string) (Image, error) {
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		return Image{}, fmt.Errorf("dockerfile: %w", err)
	}
	stages, err := parseDockerfile(string(b))
	if err != nil {
		return Image{}, fmt.Errorf("%s: %w", dockerfile, err)
	}
	img := Image{Ref: ref}
	built := map[string]bool{}
	for i, st := range stages {
		last := i == len(stages)-1
		vars := map[string]string{}
		var env []string
		if last && st.from != "scratch" {
			return Image{}, fmt.Errorf("%s: the last stage must be FROM scratch, not %s", dockerfile, st.from)
		}
		for _, in := range st.instructions {
			fail := func(format string, a ...any) error {
				return fmt.Errorf("%s:%d: %s: %s", dockerfile, in.line, in.verb, fmt.Sprintf(format, a...))
			}
			expand := func(s string) string {
				return os.Expand(s, func(k string) string { return vars[k] })
			}
			switch {
			case in.verb == "ARG":
				name, def, _ := strings.Cut(in.rest, "=")
				if v, ok := args[name]; ok {
					def = v
				}
				vars[name] = def
			case in.verb == "ENV":
				k, v, ok := strings.Cut(in.rest, "=")
				if !ok || strings.ContainsAny(k, " \t") {
					return Image{}, fail("only the KEY=value form is known")
				}
				vars[k] = expand(v)
				env = append(env, k+"="+expand(v))
			case !last && in.verb == "WORKDIR":
			case !last && in.verb == "COPY" && !strings.HasPrefix(in.rest, "--"):
			case !last && in.verb == "RUN":
				cmd := exec.CommandContext(ctx, "sh", "-c", in.rest)
				cmd.Dir = contextDir
				cmd.Env = os.Environ()
				for k, v := range vars {
					cmd.Env = append(cmd.Env, k+"="+v)
				}
				if out, err := cmd.CombinedOutput(); err != nil {
					return Image{}, fail("%v\n%s", err, out)
				}
			case last && in.verb == "COPY":
				f := strings.Fields(in.rest)
				if len(f) != 3 {
					return Image{}, fail("only COPY --from=<an earlier stage> SRC DST is known")
				}
				stage, ok := strings.CutPrefix(f[0], "--from=")
				if !ok || !built[stage] {
					return Image{}, fail("only COPY --from=<an earlier stage> SRC DST is known")
				}
				src, dst := expand(f[1]), strings.TrimPrefix(expand(f[2]), "/")
				if strings.HasSuffix(dst, "/") || dst == "" {
					dst = path.Join(dst, filepath.Base(src))
				}
				l := NewLayer()
				if err := l.CopyFile(src, dst); err != nil {
					return Image{}, fail("%v", err)
				}
				img.Layers = append(img.Layers, l)
			case last && (in.verb == "ENTRYPOINT" || in.verb == "CMD"):
				var argv []string
				if err := json.Unmarshal([]byte(in.rest), &argv); err != nil {
					return Image{}, fail("only the JSON form is known: %v", err)
				}
				if in.verb == "ENTRYPOINT" {
					img.Entrypoint = argv
				} else {
					img.Cmd = argv
				}
			default:
				return Image{}, fail("not known to this builder (test/e2e/dockerfile.go): teach it, or keep the recipe to what it knows")
			}
		}
		if last {
			img.Env = env
		}
		built[st.name] = true
	}
	if len(img.Layers) == 0 {
		return Image{}, fmt.Errorf("%s: the image has no content", dockerfile)
	}
	return img, nil
}

type dockerStage struct {
	from, name   string
	instructions []dockerInstruction
}

type dockerInstruction struct {
	verb, rest string
	line       int
}

// parseDockerfile splits a Dockerfile into stages of instructions: comments and blank lines
// dropped, continued lines joined.
func parseDockerfile(text string) ([]dockerStage, error) {
	var stages []dockerStage
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		start := i + 1
		line := strings.TrimSpace(lines[i])
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(lines[i])
		}
		verb, rest, _ := strings.Cut(line, " ")
		in := dockerInstruction{verb: strings.ToUpper(verb), rest: strings.TrimSpace(rest), line: start}
		if in.verb == "FROM" {
			f := strings.Fields(in.rest)
			st := dockerStage{from: f[0], name: fmt.Sprint(len(stages))}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			} else if len(f) != 1 {
				return nil, fmt.Errorf("line %d: FROM %s: expected FROM IMAGE [AS NAME]", start, in.rest)
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			return nil, fmt.Errorf("line %d: %s before FROM", start, in.verb)
		}
		stages[len(stages)-1].instructions = append(stages[len(stages)-1].instructions, in)
	}
	if len(stages) == 0 {
		return nil, fmt.Errorf("no FROM")
	}
	return stages, nil
}
