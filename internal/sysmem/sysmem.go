// Package sysmem reads how much memory the machine has free, for the
// budgets and refusals that size themselves by it ("auto" weight budgets,
// a training batch, a distillation's text).
package sysmem

import "github.com/shirou/gopsutil/v3/mem"

// Available is the memory the OS can give without swapping (Linux's
// MemAvailable), in bytes.
func Available() (uint64, error) {
	vm, err := mem.VirtualMemory()
	if err != nil {
		return 0, err
	}
	return vm.Available, nil
}
