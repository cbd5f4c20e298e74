"""The validation report: report.json's document, report.md and the PNG plots."""
