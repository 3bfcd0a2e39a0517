"""What the agent says about itself: metrics, Triton's metrics, the access log,
traces, statistics and the status views."""
