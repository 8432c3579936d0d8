"""The verifier: speculative decoding that scores drafters."""
