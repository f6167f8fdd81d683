#include "data/retrieval_mixtures.h"

namespace linearize {

nlohmann::json copy_drill_mixture() {
  return {{"sources",
           {{{"generator", "retrieval_episodes"}, {"weight", 0.25}, {"min_chars", 0}, {"max_chars", 250},
             {"max_needles", 1}, {"max_questions", 1}},
            {{"generator", "copy_drills"}, {"weight", 0.7}, {"max_values", 4}},
            {{"generator", "english_like"}, {"weight", 0.05}}}}};
}

}  // namespace linearize
