"""Running a node as an operating-system service (systemd on Linux, launchd on macOS)."""
