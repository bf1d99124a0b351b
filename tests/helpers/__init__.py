"""What the tests share besides fixtures and workers: serving a worker in a block, local
clusters, fault campaigns, hash slots, the docs runner."""
