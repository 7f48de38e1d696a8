package v1alpha1

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ValidateName says what is wrong with a cluster name and what would be right.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("a cluster name is required: use lowercase letters, digits and '-', e.g. ci-main")
	}
	if len(name) > MaxNameLength {
		return fmt.Errorf("cluster name %q is %d characters; at most %d are allowed (it prefixes node names, which must stay DNS labels)", name, len(name), MaxNameLength)
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("cluster name %q is not a DNS-1123 label: %s; use lowercase letters, digits and '-', starting and ending with a letter or digit, e.g. ci-main", name, strings.Join(errs, "; "))
	}
	return nil
}
