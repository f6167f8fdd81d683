// Plain-text SVG charts. See svg.h. Coordinates are in pixels of the figure's viewBox; every chart
// lays out a title band at the top, axis labels at the left and bottom, and the plot area between.
#include "report/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace linearize {

namespace {

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string fmt(const char* f, double v) {
  char b[48];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string open_svg(double w, double h) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(w) + "\" height=\"" + num(h) +
         "\" viewBox=\"0 0 " + num(w) + " " + num(h) +
         "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
         "<rect x=\"0\" y=\"0\" width=\"" + num(w) + "\" height=\"" + num(h) + "\" fill=\"white\"/>\n";
}

std::string text(double x, double y, const std::string& s, const std::string& extra = "") {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"" + (extra.empty() ? "" : " " + extra) + ">" +
         xml_escape(s) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const std::string& style) {
  return "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) + "\" " +
         style + "/>\n";
}

// A "nice" tick step (1, 2 or 5 x 10^k) giving about `n` ticks over `span`.
double nice_step(double span, int n) {
  if (!(span > 0)) return 1;
  const double raw = span / n;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

// Three significant digits past a thousand: a teacher of 27402752 parameters reads 27.4M.
std::string tick_label(double v) {
  if (std::fabs(v) >= 1e9) return fmt("%.3gB", v / 1e9);
  if (std::fabs(v) >= 1e6) return fmt("%.3gM", v / 1e6);
  if (std::fabs(v) >= 1e4) return fmt("%.3gk", v / 1e3);
  return fmt("%g", v);
}

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string accuracy_colour(double v) {
  v = std::clamp(v, 0.0, 1.0);
  // red (215,48,39) -> yellow (254,224,139) -> green (26,152,80)
  const double a[3] = {215, 48, 39}, m[3] = {254, 224, 139}, g[3] = {26, 152, 80};
  double c[3];
  for (int i = 0; i < 3; ++i) c[i] = v < 0.5 ? a[i] + (m[i] - a[i]) * v * 2 : m[i] + (g[i] - m[i]) * (v - 0.5) * 2;
  char b[8];
  std::snprintf(b, sizeof b, "#%02x%02x%02x", static_cast<int>(std::lround(c[0])), static_cast<int>(std::lround(c[1])),
                static_cast<int>(std::lround(c[2])));
  return b;
}

std::string svg_heatmap(const Heatmap& h) {
  const double cell_w = 64, cell_h = 30, left = 90, top = 50, bottom = 60;
  const size_t rows = h.values.size(), cols = rows ? h.values[0].size() : 0;
  const double w = left + cols * cell_w + 90, hh = top + rows * cell_h + bottom;
  std::ostringstream o;
  const double title_w = left + 8.5 * h.title.size() + 20;  // bold 15px text is about 8.5 px a character
  o << open_svg(std::max({w, 320.0, title_w}), hh);
  o << text(left, 24, h.title, "font-size=\"15\" font-weight=\"bold\"");
  for (size_t r = 0; r < rows; ++r) {
    const double y = top + r * cell_h;
    if (r < h.row_labels.size()) o << text(left - 8, y + cell_h / 2 + 4, h.row_labels[r], "text-anchor=\"end\"");
    for (size_t c = 0; c < h.values[r].size(); ++c) {
      const double x = left + c * cell_w, v = h.values[r][c];
      const bool empty = !std::isfinite(v);  // no sample in this cell
      o << "<rect class=\"cell\" x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\"" << num(cell_w)
        << "\" height=\"" << num(cell_h) << "\" fill=\"" << (empty ? "#e0e0e0" : accuracy_colour(v))
        << "\" stroke=\"white\" stroke-width=\"1\"/>\n";
      o << text(x + cell_w / 2, y + cell_h / 2 + 4, empty ? "-" : fmt("%.0f%%", 100 * v),
                "text-anchor=\"middle\" font-size=\"11\"");
    }
  }
  const double base = top + rows * cell_h;
  for (size_t c = 0; c < cols && c < h.col_labels.size(); ++c)
    o << text(left + c * cell_w + cell_w / 2, base + 16, h.col_labels[c], "text-anchor=\"middle\"");
  o << text(left + cols * cell_w / 2, base + 40, h.x_label, "text-anchor=\"middle\"");
  o << text(16, top + rows * cell_h / 2, h.y_label,
            "text-anchor=\"middle\" transform=\"rotate(-90 16 " + num(top + rows * cell_h / 2) + ")\"");
  // colour scale
  const double sx = left + cols * cell_w + 20;
  for (int i = 0; i <= 10; ++i)
    o << "<rect x=\"" << num(sx) << "\" y=\"" << num(top + (10 - i) * 12) << "\" width=\"14\" height=\"12\" fill=\""
      << accuracy_colour(i / 10.0) << "\"/>\n";
  o << text(sx + 18, top + 10, "100%", "font-size=\"10\"") << text(sx + 18, top + 130, "0%", "font-size=\"10\"");
  o << "</svg>\n";
  return o.str();
}

std::string svg_bar_chart(const std::string& title, const std::vector<Bar>& bars, const std::string& y_label,
                          double reference) {
  const double left = 70, top = 50, plot_h = 300, bar_w = 56, gap = 24, bottom = 90;
  const double plot_w = std::max<double>(200, bars.size() * (bar_w + gap) + gap);
  double y_max = reference;
  for (const auto& b : bars) y_max = std::max(y_max, b.value);
  const double step = nice_step(y_max > 0 ? y_max : 1, 5);
  y_max = std::ceil((y_max > 0 ? y_max * 1.05 : 1) / step) * step;
  auto y_of = [&](double v) { return top + plot_h - plot_h * v / y_max; };
  std::ostringstream o;
  o << open_svg(left + plot_w + 30, top + plot_h + bottom);
  o << text(left, 24, title, "font-size=\"15\" font-weight=\"bold\"");
  for (double t = 0; t <= y_max + 1e-9; t += step) {
    o << line(left, y_of(t), left + plot_w, y_of(t), "stroke=\"#e0e0e0\"");
    o << text(left - 6, y_of(t) + 4, tick_label(t), "text-anchor=\"end\" font-size=\"11\"");
  }
  for (size_t i = 0; i < bars.size(); ++i) {
    const double x = left + gap + i * (bar_w + gap), y = y_of(std::max(0.0, bars[i].value));
    o << "<rect class=\"bar\" x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\"" << num(bar_w) << "\" height=\""
      << num(top + plot_h - y) << "\" fill=\"" << kPalette[i % 8] << "\"/>\n";
    o << text(x + bar_w / 2, y - 5, fmt("%.1f", bars[i].value), "text-anchor=\"middle\" font-size=\"11\"");
    const double lx = x + bar_w / 2, ly = top + plot_h + 14;
    o << text(lx, ly, bars[i].label,
              "text-anchor=\"end\" font-size=\"11\" transform=\"rotate(-35 " + num(lx) + " " + num(ly) + ")\"");
  }
  if (reference > 0)
    o << line(left, y_of(reference), left + plot_w, y_of(reference), "stroke=\"#444\" stroke-dasharray=\"6 4\"");
  o << line(left, top, left, top + plot_h, "stroke=\"black\"")
    << line(left, top + plot_h, left + plot_w, top + plot_h, "stroke=\"black\"");
  o << text(18, top + plot_h / 2, y_label,
            "text-anchor=\"middle\" transform=\"rotate(-90 18 " + num(top + plot_h / 2) + ")\"");
  o << "</svg>\n";
  return o.str();
}

std::string svg_line_chart(const std::string& title, const std::vector<Series>& series, const std::string& x_label,
                           const std::string& y_label, bool log_x) {
  const double left = 70, top = 50, plot_w = 480, plot_h = 300, bottom = 60, legend_w = 170;
  double x_lo = 1e300, x_hi = -1e300, y_hi = 0, y_lo = 1e300;
  auto tx = [&](double x) { return log_x ? std::log10(std::max(x, 1e-300)) : x; };
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      x_lo = std::min(x_lo, tx(x));
      x_hi = std::max(x_hi, tx(x));
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  if (x_lo > x_hi) x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
  if (x_hi - x_lo < 1e-12) x_lo -= 0.5, x_hi += 0.5;
  const double step = nice_step(y_hi - std::min(0.0, y_lo), 5);
  const double y_min = std::min(0.0, std::floor(y_lo / step) * step), y_max = std::ceil(y_hi * 1.05 / step) * step;
  auto px = [&](double x) { return left + plot_w * (tx(x) - x_lo) / (x_hi - x_lo) * 0.9 + plot_w * 0.05; };
  auto py = [&](double y) { return top + plot_h - plot_h * (y - y_min) / std::max(1e-12, y_max - y_min); };
  std::ostringstream o;
  o << open_svg(left + plot_w + legend_w, top + plot_h + bottom);
  o << text(left, 24, title, "font-size=\"15\" font-weight=\"bold\"");
  for (double t = y_min; t <= y_max + 1e-9; t += step) {
    o << line(left, py(t), left + plot_w, py(t), "stroke=\"#e0e0e0\"");
    o << text(left - 6, py(t) + 4, tick_label(t), "text-anchor=\"end\" font-size=\"11\"");
  }
  std::vector<double> xs;
  for (const auto& s : series)
    for (const auto& p : s.points) xs.push_back(p.first);
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  for (double x : xs) o << text(px(x), top + plot_h + 16, tick_label(x), "text-anchor=\"middle\" font-size=\"11\"");
  for (size_t i = 0; i < series.size(); ++i) {
    auto pts = series[i].points;
    std::sort(pts.begin(), pts.end());
    std::string path;
    for (const auto& [x, y] : pts) path += num(px(x)) + "," + num(py(y)) + " ";
    o << "<polyline class=\"series\" fill=\"none\" stroke=\"" << kPalette[i % 8] << "\" stroke-width=\"2\" points=\""
      << path << "\"/>\n";
    for (const auto& [x, y] : pts)
      o << "<circle cx=\"" << num(px(x)) << "\" cy=\"" << num(py(y)) << "\" r=\"3.5\" fill=\"" << kPalette[i % 8]
        << "\"/>\n";
    const double ly = top + 10 + 20 * i;
    o << line(left + plot_w + 16, ly, left + plot_w + 36, ly, "stroke=\"" + std::string(kPalette[i % 8]) + "\" stroke-width=\"2\"");
    o << text(left + plot_w + 42, ly + 4, series[i].name);
  }
  o << line(left, top, left, top + plot_h, "stroke=\"black\"")
    << line(left, top + plot_h, left + plot_w, top + plot_h, "stroke=\"black\"");
  o << text(left + plot_w / 2, top + plot_h + 40, x_label + (log_x ? " (log scale)" : ""), "text-anchor=\"middle\"");
  o << text(18, top + plot_h / 2, y_label,
            "text-anchor=\"middle\" transform=\"rotate(-90 18 " + num(top + plot_h / 2) + ")\"");
  o << "</svg>\n";
  return o.str();
}

}  // namespace linearize
