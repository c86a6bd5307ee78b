// SPDX-License-Identifier: Apache-2.0
// The kiln CLI (placeholder until `kiln inspect` lands).
#include <stdio.h>

#include "kiln/kiln.h"

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("kiln %s\n", kiln_version_string());
    return 0;
}
