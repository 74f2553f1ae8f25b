"""`python -m probepkg.train`: the corpus probe run as a package's module."""

import probe

if __name__ == "__main__":
    probe.main()
