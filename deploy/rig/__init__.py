"""A multi-site edgeplex fleet on one Linux box: network namespaces, veth, a
bridge and `tc netem` delays between regions (`edgeplex rig up|down|status`)."""
