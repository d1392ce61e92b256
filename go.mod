module github.com/tandem-llm/tandem

go 1.26.0

require (
	github.com/edsrzf/mmap-go v1.2.0 // indirect
	github.com/shirou/gopsutil/v3 v3.24.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
