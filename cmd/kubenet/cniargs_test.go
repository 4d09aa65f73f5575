package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func TestParseCNIArgs(t *testing.T) {
	cases := []struct {
		args, pod string
		wantErr   bool
	}{
		{"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=x", "default/web-0", false},
		{"K8S_POD_NAME=solo", "solo", false},
		{"", "", false},
		{"IgnoreUnknown=1;SOMETHING=else", "", false},
		{"SOMETHING=else", "", true},
		{"K8S_POD_NAME", "", true},
	}
	for _, tc := range cases {
		args, err := ParseCNIArgs(tc.args)
		if (err != nil) != tc.wantErr {
			t.Errorf("ParseCNIArgs(%q) error %v, want error %v", tc.args, err, tc.wantErr)
			continue
		}
		if got := args.Pod(); got != tc.pod {
			t.Errorf("ParseCNIArgs(%q).Pod() = %q, want %q", tc.args, got, tc.pod)
		}
	}
}

func FuzzParseCNIArgs(f *testing.F) {
	for _, seed := range []string{
		"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1-2",
		"K8S_POD_NAME=x", "IgnoreUnknown=true;FOO=bar", "FOO=bar", "=;;=", "K8S_POD_NAME", "",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args, err := ParseCNIArgs(s)
		if err != nil {
			var e *types.Error
			if !errors.As(err, &e) || e.Code != types.ErrInvalidEnvironmentVariables {
				t.Fatalf("ParseCNIArgs(%q) error %v, want a CNI error with code %d", s, err, types.ErrInvalidEnvironmentVariables)
			}
			return
		}
		if pod := args.Pod(); pod != "" && !strings.Contains(s, string(args.K8S_POD_NAME)) {
			t.Fatalf("pod %q not taken from %q", pod, s)
		}
	})
}
