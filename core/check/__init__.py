"""The trace checker: rules over recorded rounds, with their proofs for chains, trees and coupled runs,
and run diffs."""
