void str_reverse(char *s);
