/* The process's measured choices (cuda_choice_cache.h): a linear table under one lock; init
 * looks up a few hundred keys at most, so a scan costs nothing next to one measurement. */
#include "cuda_choice_cache.h"

#include <pthread.h>
#include <string.h>

#define KCU_CHOICE_SLOTS 1024

typedef struct kcu_choice {
  size_t key_len, value_len;
  unsigned char key[KCU_CHOICE_KEY_BYTES], value[KCU_CHOICE_VALUE_BYTES];
} kcu_choice;

static kcu_choice kcu_choices[KCU_CHOICE_SLOTS];
static uint32_t kcu_n_choices;
static pthread_mutex_t kcu_choice_lock = PTHREAD_MUTEX_INITIALIZER;

static kcu_choice *kcu_choice_slot(const void *key, size_t key_len) {
  for (uint32_t i = 0; i < kcu_n_choices; i++)
    if (kcu_choices[i].key_len == key_len && memcmp(kcu_choices[i].key, key, key_len) == 0)
      return &kcu_choices[i];
  return NULL;
}

int kcu_choice_find(const void *key, size_t key_len, void *value, size_t value_len) {
  int found = 0;
  if (key_len > KCU_CHOICE_KEY_BYTES || value_len > KCU_CHOICE_VALUE_BYTES) return 0;
  pthread_mutex_lock(&kcu_choice_lock);
  const kcu_choice *c = kcu_choice_slot(key, key_len);
  if (c && c->value_len == value_len) {
    memcpy(value, c->value, value_len);
    found = 1;
  }
  pthread_mutex_unlock(&kcu_choice_lock);
  return found;
}

void kcu_choice_keep(const void *key, size_t key_len, const void *value, size_t value_len) {
  if (key_len > KCU_CHOICE_KEY_BYTES || value_len > KCU_CHOICE_VALUE_BYTES) return;
  pthread_mutex_lock(&kcu_choice_lock);
  kcu_choice *c = kcu_choice_slot(key, key_len);
  if (!c && kcu_n_choices < KCU_CHOICE_SLOTS) c = &kcu_choices[kcu_n_choices++];
  if (c) {
    c->key_len = key_len;
    c->value_len = value_len;
    memcpy(c->key, key, key_len);
    memcpy(c->value, value, value_len);
  }
  pthread_mutex_unlock(&kcu_choice_lock);
}
