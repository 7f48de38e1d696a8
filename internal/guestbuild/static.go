package guestbuild

import (
	"debug/elf"
	"fmt"
)

// CheckStatic fails unless file is an x86-64 ELF executable without a
// program interpreter (PT_INTERP), i.e. one that runs without a dynamic
// loader or libc in the guest.
func CheckStatic(file string) error {
	f, err := elf.Open(file)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (has PT_INTERP): build with CGO_ENABLED=0", file)
		}
	}
	// ET_DYN without an interpreter is a static PIE.
	if f.Machine != elf.EM_X86_64 || (f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN) {
		return fmt.Errorf("%s is a %s %s, want a static x86-64 executable", file, f.Machine, f.Type)
	}
	return nil
}
