// Package pythonpkg carries gorun's worker-side Python package
// (python/gorun) inside the gorun binary, so that every Python worker an
// agent starts can import it without installing anything: the agent
// extracts it into its job's snapshot directory (Extract) and puts that on
// the workers' PYTHONPATH.
package pythonpkg
