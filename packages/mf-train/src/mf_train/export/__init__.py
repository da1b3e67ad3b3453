"""A trained checkpoint used outside training: as a Hugging Face directory, at another
tensor-parallel degree, generating text."""
