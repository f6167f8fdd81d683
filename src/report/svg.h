// SVG figures written as plain text, no plotting library: a heatmap (NIAH accuracy, depth x length),
// a bar chart (recovery per model) and a line chart (a metric against scale or token budget, one
// line per mixer). Each function returns a complete standalone <svg> document with inline styles
// and system fonts, so a browser or an image viewer renders it as it is.
//
// Not done: interactivity, legends that wrap, log axes other than base 10, automatic tick rounding
// beyond "nice" steps of 1/2/5 x 10^k.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace linearize {

// values[r][c] in [0, 1]: one <rect class="cell"> per value, coloured red (0) to green (1), labelled
// in percent. Rows are drawn top to bottom.
struct Heatmap {
  std::string title, x_label, y_label;
  std::vector<std::string> row_labels, col_labels;
  std::vector<std::vector<double>> values;
};
std::string svg_heatmap(const Heatmap& h);

struct Bar {
  std::string label;
  double value = 0;
};
// Bars from 0; a dashed line at `reference` when it is > 0 (e.g. 100 for recovery %).
std::string svg_bar_chart(const std::string& title, const std::vector<Bar>& bars, const std::string& y_label,
                          double reference = 0);

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in x order
};
std::string svg_line_chart(const std::string& title, const std::vector<Series>& series, const std::string& x_label,
                           const std::string& y_label, bool log_x);

// &, <, >, " and ' as entities.
std::string xml_escape(const std::string& s);
// A colour from red (0) through yellow to green (1), "#rrggbb".
std::string accuracy_colour(double v);

}  // namespace linearize
