"""What a node counts and measures while the tree trains: the counters ``Client.stats()`` reads
and the windows of the last K steps ``crnet tune`` fits. Pure data."""
