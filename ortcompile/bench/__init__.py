"""`ortcompile bench`: the residency pool and the pipeline that run compiled models."""
