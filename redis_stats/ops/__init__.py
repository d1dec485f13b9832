"""Operations on a namespace in Redis: retention (removing dead writers' series),
inspection, listing namespaces."""
