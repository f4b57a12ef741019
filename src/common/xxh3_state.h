#pragma once
// An owned XXH3_64bits streaming state (the checksums of packs, prompt caches and the embedding
// record are taken piece by piece).

#include <xxhash.h>

#include <memory>
#include <new>

namespace ktier {

using Xxh3State = std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)>;

// A fresh state, reset. Throws std::bad_alloc when xxhash cannot allocate it (out of memory is
// not a bug: serve goes on after it).
inline Xxh3State new_xxh3_state() {
  Xxh3State state(XXH3_createState(), &XXH3_freeState);
  if (state == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(state.get());
  return state;
}

}  // namespace ktier
