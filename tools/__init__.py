"""Build and inspection aids for tests, benchmarks and CI; never imported by the product."""
