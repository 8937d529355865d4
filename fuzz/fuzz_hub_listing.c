/*
 * fuzz_hub_listing: libFuzzer target for the Hub's repository listing
 * (hub_listing_parse), the one document a pull takes from the server before
 * it builds paths. Any crash, leak or undefined behaviour is a bug; an
 * accepted listing must hold only names that stay inside a snapshot, a
 * 40-digit commit, sizes in [-1, 1 PiB], hex sha256s, and no duplicates.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hub/hub.h"

static void check_invariants(const struct hub_listing *l)
{
    if (strlen(l->commit) != 40)
        abort();
    for (size_t i = 0; i < l->n_files; i++) {
        const struct hub_file *f = &l->files[i];
        if (!hub_name_is_safe(f->name) || f->size < -1 || f->size > (INT64_C(1) << 50) ||
            (f->sha256[0] && strlen(f->sha256) != 64))
            abort();
        if (i > 0 && strcmp(l->files[i - 1].name, f->name) >= 0)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct hub_listing l;
    struct err e = {0};
    if (hub_listing_parse(&l, (const char *)data, size, &e) == 0) {
        check_invariants(&l);
        hub_listing_deinit(&l);
    }
    return 0;
}
