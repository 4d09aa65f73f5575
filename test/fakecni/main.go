// Command fakecni is a CNI plugin for tests of the code that runs plugins (network/cni): it
// records what each call was given and misbehaves on request. Configuration keys:
//
//	recordDir      where each call writes <VERB>-<containerID>.json: its pid, CNI_NETNS,
//	               CNI_IFNAME, CNI_ARGS and the configuration it read on stdin
//	hang           verbs that never finish (the caller's timeout must kill the process)
//	delError       DEL fails with this message
//	delNeedsNetns  DEL fails the way old plugins did when CNI_NETNS is gone:
//	               "failed to Statfs "<path>": no such file or directory"
//
// ADD prints prevResult when it has one (so it can sit in a chain), else an empty result.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

type conf struct {
	types.PluginConf
	RecordDir     string   `json:"recordDir"`
	Hang          []string `json:"hang"`
	DelError      string   `json:"delError"`
	DelNeedsNetns bool     `json:"delNeedsNetns"`
}

// Record is what one call wrote (test/shim reads it back).
type Record struct {
	Pid    int             `json:"pid"`
	NetNS  string          `json:"netns"`
	IfName string          `json:"ifName"`
	Args   string          `json:"args"`
	Stdin  json.RawMessage `json:"stdin"`
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    func(a *skel.CmdArgs) error { return call("ADD", a) },
		Del:    func(a *skel.CmdArgs) error { return call("DEL", a) },
		Check:  func(a *skel.CmdArgs) error { return call("CHECK", a) },
		Status: func(a *skel.CmdArgs) error { return nil },
		GC:     func(a *skel.CmdArgs) error { return nil },
	}, version.All, "fakecni (tests only)")
}

func call(verb string, args *skel.CmdArgs) error {
	var c conf
	if err := json.Unmarshal(args.StdinData, &c); err != nil {
		return fmt.Errorf("decode configuration: %w", err)
	}
	if c.RecordDir != "" {
		rec, _ := json.Marshal(Record{Pid: os.Getpid(), NetNS: args.Netns, IfName: args.IfName, Args: args.Args, Stdin: args.StdinData})
		if err := os.WriteFile(filepath.Join(c.RecordDir, verb+"-"+args.ContainerID+".json"), rec, 0o644); err != nil {
			return err
		}
	}
	if slices.Contains(c.Hang, verb) {
		time.Sleep(24 * time.Hour)
	}
	switch verb {
	case "DEL":
		if c.DelError != "" {
			return errors.New(c.DelError)
		}
		if c.DelNeedsNetns {
			if _, err := os.Stat(args.Netns); args.Netns == "" || err != nil {
				return fmt.Errorf("failed to Statfs %q: no such file or directory", args.Netns)
			}
		}
		return nil
	case "ADD":
		if err := version.ParsePrevResult(&c.PluginConf); err != nil {
			return err
		}
		result := &current.Result{CNIVersion: c.CNIVersion}
		if c.PrevResult != nil {
			r, err := current.NewResultFromResult(c.PrevResult)
			if err != nil {
				return err
			}
			result = r
		}
		return types.PrintResult(result, c.CNIVersion)
	}
	return nil
}
