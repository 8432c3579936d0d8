"""Drafters as plain nn.Modules / objects implementing the verifier's protocol."""
