"""Optional features of a worker, each behind the core's seam (`core.seam.Feature`)."""
