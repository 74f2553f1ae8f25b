"""A package for the corpus's `-m package.module` lines (torchtitan's -m torchtitan.train)."""
