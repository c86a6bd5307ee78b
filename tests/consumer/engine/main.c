// SPDX-License-Identifier: Apache-2.0
// Prints the Kiln version and the option table: links libkiln.so only.
#include <stdio.h>
#include <string.h>

#include "kiln/kiln.h"

int main(void) {
    printf("kiln %s\n", kiln_version_string());
    for (uint32_t i = 0; i < kiln_option_count(); i++) {
        const char *name, *def, *scope;
        kiln_option_type type;
        if (kiln_option_info(i, &name, &type, &def, &scope) == KILN_OK) {
            printf("option %s = %s (%s)\n", name, def, scope);
        }
    }
    return strcmp(kiln_version_string(), KILN_VERSION_STRING) == 0 ? 0 : 1;
}
