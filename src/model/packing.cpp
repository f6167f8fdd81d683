// Packed documents (token_mixer.h): the boundary bookkeeping and the default forward_packed of every
// token mixer, which runs each document in a row of its own.
//
//   x [B, T, C] --gather--> [N, Lmax, C] (document n right-padded with zeros) --forward--> [N, Lmax, C]
//   --scatter--> [B, T, C]
// A causal mixer's output at position t reads only positions <= t of its own row, so the padding is
// never read and every document starts from an empty state (matrix state and conv buffers at zero),
// exactly as when it is run alone. Both index maps are index_select, so gradients flow through.
#include <algorithm>

#include "io/error.h"
#include "model/token_mixer.h"

namespace linearize {

PackedRows PackedRows::from_doc_ids(const torch::Tensor& doc) {
  if (doc.dim() != 2) throw Error("packed rows: expected document ids [B, T], got " + std::to_string(doc.dim()) + " dims");
  auto d = doc.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t B = d.size(0), T = d.size(1);
  const int64_t* p = d.data_ptr<int64_t>();
  PackedRows rows;
  rows.starts.resize(B);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t)
      if (t == 0 || p[b * T + t] != p[b * T + t - 1]) rows.starts[b].push_back(t);
  }
  return rows;
}

int64_t PackedRows::num_documents() const {
  int64_t n = 0;
  for (const auto& s : starts) n += static_cast<int64_t>(s.size());
  return n;
}

torch::Tensor TokenMixer::forward_packed(const torch::Tensor& x, const PackedRows& rows) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  if (static_cast<int64_t>(rows.starts.size()) != B)
    throw Error("packed rows: " + std::to_string(rows.starts.size()) + " rows of boundaries for a batch of " +
                std::to_string(B));
  struct Doc {
    int64_t row, begin, length;
  };
  std::vector<Doc> docs;
  int64_t lmax = 0;
  for (int64_t b = 0; b < B; ++b) {
    const auto& s = rows.starts[b];
    for (size_t i = 0; i < s.size(); ++i) {
      const int64_t end = i + 1 < s.size() ? s[i + 1] : T;
      if (end <= s[i] || s[i] < 0 || end > T) throw Error("packed rows: boundaries of row " + std::to_string(b) + " are not ascending within [0, T)");
      docs.push_back({b, s[i], end - s[i]});
      lmax = std::max(lmax, end - s[i]);
    }
  }
  const int64_t N = static_cast<int64_t>(docs.size());
  // gather[n * lmax + j] = flat index of document n's token j, or B*T (a zero row) for padding.
  std::vector<int64_t> gather(N * lmax, B * T), scatter(B * T, 0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < docs[n].length; ++j) {
      const int64_t flat = docs[n].row * T + docs[n].begin + j;
      gather[n * lmax + j] = flat;
      scatter[flat] = n * lmax + j;
    }
  }
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(x.device());
  auto flat = torch::cat({x.reshape({B * T, C}), torch::zeros({1, C}, x.options())}, 0);  // [B*T+1, C]
  auto xs = flat.index_select(0, torch::tensor(gather, torch::kLong).to(opts.device())).view({N, lmax, C});
  auto ys = forward(xs, nullptr);  // [N, lmax, C]
  auto out = ys.reshape({N * lmax, ys.size(2)}).index_select(0, torch::tensor(scatter, torch::kLong).to(opts.device()));
  return out.view({B, T, ys.size(2)});
}

}  // namespace linearize
