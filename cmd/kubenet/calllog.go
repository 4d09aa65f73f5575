package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/verblog"
)

// logCall appends the call to the configuration's logFile, if it names one: verb, network,
// container, interface, netns, pod, the CNI version the runtime called with, duration, and the
// result or the CNI error. A successful STATUS is not logged: runtimes poll it every few
// seconds, and its lines would push the pods' out of the bounded file. The log keys are read on
// their own, so a call whose configuration is otherwise invalid is logged with that error. A log
// that cannot be written is reported on stderr (runtimes keep it as the plugin's debug output)
// and never fails the call; ctx is the call's, which bounds the wait for the log's lock
// (verblog.Append).
func logCall(ctx context.Context, verb string, args *skel.CmdArgs, start time.Time, result *verblog.Result, err error) {
	settings, serr := core.ParseLogSettings(args.StdinData)
	if serr != nil || settings.File == "" || (verb == "STATUS" && err == nil) {
		return
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
	}
	_ = json.Unmarshal(args.StdinData, &conf)
	pod, _ := ParseCNIArgs(args.Args)
	e := verblog.Entry{
		Time: start.UTC(), Verb: verb, CNIVersion: conf.CNIVersion, Network: conf.Name,
		Container: args.ContainerID, Interface: args.IfName, NetNS: args.Netns, Pod: pod.Pod(),
		DurationMs: float64(time.Since(start).Microseconds()) / 1000,
	}
	if err != nil {
		e.Error = &verblog.Error{Code: types.ErrInternal, Msg: err.Error()}
		var te *types.Error
		if errors.As(err, &te) {
			e.Error.Code, e.Error.Msg = te.Code, te.Msg
			if te.Details != "" {
				e.Error.Msg += ": " + te.Details
			}
		}
	} else {
		e.Result = result
	}
	if werr := verblog.Append(ctx, settings.File, settings.MaxBytes, e); werr != nil {
		fmt.Fprintf(os.Stderr, "kubenet: call log %s: %v\n", settings.File, werr)
	}
}
