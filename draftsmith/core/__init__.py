"""The core every other layer builds on: the frozen target, sampling and acceptance rules, draft trees and the
drafter protocol, and the native drafter file format. Imports nothing from the rest of draftsmith."""
