// Package report is regionsim's output: the Report a run produces and its
// three renderings, a text summary (WriteText), machine-readable JSON
// (WriteJSON) and a self-contained HTML page with timelines of throughput
// and latency per region, fault windows shaded, and the comparison table
// (WriteHTML). Latency is the result of a latency measurement, with its
// own text table, JSON and HTML page (WriteLatencyText, WriteLatencyJSON,
// WriteLatencyHTML).
package report
