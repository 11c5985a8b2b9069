"""What a running system offers its operators: the status, its metrics, the runtime files, the logs."""
