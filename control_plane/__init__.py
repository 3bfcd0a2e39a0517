"""The edgeplex control plane: catalog, site registry, demand, placement; state in Redis."""
