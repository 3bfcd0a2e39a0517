"""The Open Inference Protocol's requests, tensors and errors, shared by every part
of the agent."""
