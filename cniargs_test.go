package kubenet

import "testing"

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
