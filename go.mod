module github.com/tandem-llm/tandem

go 1.26.0

require (
	github.com/edsrzf/mmap-go v1.2.0
	github.com/shirou/gopsutil/v3 v3.24.5
	golang.org/x/sys v0.49.0
	gorgonia.org/cu v0.9.6
)

require (
	github.com/go-ole/go-ole v1.2.6 // indirect
	github.com/google/uuid v1.1.1 // indirect
	github.com/lufia/plan9stats v0.0.0-20211012122336-39d0f177ccd0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/power-devops/perfstat v0.0.0-20210106213030-5aafc221ea8c // indirect
	github.com/tklauser/go-sysconf v0.3.12 // indirect
	github.com/tklauser/numcpus v0.6.1 // indirect
	github.com/yusufpapurcu/wmi v1.2.4 // indirect
)
