"""A local fleet whose machines have their own addresses: network namespaces on a bridge (astraeus.fleet.netns)."""
