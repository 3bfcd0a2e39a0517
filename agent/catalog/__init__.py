"""The models an agent can serve: its repository on disk, Triton's and edgeplex's
model configuration, graphs, and the forms a model may take."""
